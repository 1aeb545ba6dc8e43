"""`retake serve` as a process, and `retake loadtest` against the shared test server."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from live_server import RETAKE, LiveServer

from backend.app import prefix_cache_line
from backend.cli import UsageError
from backend.commands import loadtest
from backend.commands import serve as serve_command
from backend.tools.client import Director
from backend.tools.loadtest import LINES, longest_stall, playback


def test_longest_stall_follows_playback_time() -> None:
    # Windows of 1 s: the second arrives 0.5 s into playback (no stall), the third 0.5 s after the
    # second one finished playing (a 0.5 s stall), and playback then runs late by that much.
    assert longest_stall([0.0, 0.5, 2.5, 3.0], [1.0, 1.0, 1.0, 1.0]) == pytest.approx(0.5)
    assert longest_stall([10.0, 10.1, 10.2], [0.5, 0.5, 0.5]) == 0.0
    assert longest_stall([], []) == 0.0
    # The player stops 4.5 s in: four seconds of windows and the half-second stall, which fell
    # after two seconds of audio.
    assert playback([0.0, 0.5, 2.5, 3.0], [1.0, 1.0, 1.0, 1.0]) == pytest.approx((0.5, 4.5, 2.0))
    assert playback([0.0, 1.2, 2.2, 3.9], [1.0, 1.0, 1.0, 1.0]) == pytest.approx((0.7, 4.9, 3.0))  # the longest


def loadtest_report(server: LiveServer, tmp_path: Path, *options: str) -> dict[str, Any]:
    """`retake loadtest OPTIONS --json FILE` against the test server: it exits 0; its report."""
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    out = tmp_path / "load.json"
    assert loadtest.run(parser.parse_args(["--url", server.ws, *options, "--json", str(out)])) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_loadtest_listen_hears_each_take_before_the_next(server: LiveServer, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`--listen`: a session asks its next take only once the last one has played to its end (the
    tiny model streams faster than real time, so without it the next take starts mid-playback)."""
    report = loadtest_report(server, tmp_path, "--sessions", "1", "--takes", "2", "--max-new-tokens", "12", "--listen")
    first, second = report["takes"]
    heard = first["started_s"] + first["first_audio_s"] + first["audio_s"]  # at the least: stalls add to it
    assert first["audio_s"] > 0 and second["started_s"] >= heard - 1e-6
    assert "(each take heard to its end before the next)" in capsys.readouterr().out


def test_loadtest_reports_every_take(server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    out = tmp_path / "load.json"
    args = parser.parse_args(["--url", server.ws, "--sessions", "2", "--takes", "2", "--max-new-tokens", "12",
                              "--stagger-ms", "0", "--think-ms", "50", "--json", str(out)])
    assert loadtest.run(args) == 0
    printed = capsys.readouterr().out
    assert "2 sessions x 2 takes" in printed and "first audio (client)" in printed and "longest gap" in printed
    assert "take.queued (client)" in printed and "waited for a slot (server)" in printed
    assert "prefill (server)" in printed and "first window (server)" in printed
    assert "prompt rows restored from the prefix cache: " in printed and "(a 50 ms pause before each take)" in printed
    report = json.loads(out.read_text())
    assert report["failures"] == [] and len(report["takes"]) == 4
    # The client's own event loop, probed every 5 ms while the takes ran: many probes, ordered percentiles.
    assert "client event loop lag" in printed
    lag = report["client_loop_lag_s"]
    assert 0 <= lag["p50"] <= lag["p95"] <= lag["p99"] <= lag["max"]
    for take in report["takes"]:
        assert take["finish_reason"] in ("stop", "length")
        assert take["first_audio_s"] > 0 and take["longest_gap_s"] >= 0 and take["audio_s"] > 0
        assert 0 <= take["longest_gap_at_s"] < take["audio_s"] and take["number"] in (0, 1)
        assert take["timings"]["prefill_ms"] == take["prefill_ms"]  # the server's timings, whole
        assert 0 < take["queued_s"] < take["first_audio_s"]  # take.queued is sent before the audio
        # The server's first audio in its parts: the engine's queue (every slot taken), the prompt's
        # prefill, then the first frames' steps and their vocoding.
        assert 0 <= take["slot_wait_ms"] <= take["server_first_audio_ms"]
        assert take["prefill_ms"] > 0 and take["first_window_ms"] > 0
        parts = take["slot_wait_ms"] + take["prefill_ms"] + take["first_window_ms"]
        assert parts == pytest.approx(take["server_first_audio_ms"])
    # Kept takes grow each session's history: the second take's prompt holds the first.
    by_session = {s: [t for t in report["takes"] if t["session"] == s] for s in (0, 1)}
    assert all(takes[1]["prompt_rows"] > takes[0]["prompt_rows"] for takes in by_session.values())
    assert all(0 <= take["cached_rows"] <= take["prompt_rows"] for take in report["takes"])
    bad = parser.parse_args(["--url", server.ws, "--think-ms", "-1"])
    with pytest.raises(UsageError, match="--think-ms"):
        loadtest.run(bad)


def test_loadtest_writes_the_script_first_when_asked(server: LiveServer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`--script`: each session's lines are in its script, in order, before its takes (as the
    studio has them), so the server can warm each line with its text."""
    takes = loadtest_report(server, tmp_path, "--sessions", "1", "--takes", "3", "--max-new-tokens", "6",
                            "--script")["takes"]
    assert "(the lines written into the script first)" in capsys.readouterr().out
    assert len(takes) == 3 and len({take["session_id"] for take in takes}) == 1

    async def script() -> list[object]:
        director = await Director.connect(server.ws)
        ready = await director.open(takes[0]["session_id"])  # (this process holds the session's key)
        await director.close()
        return ready["lines"]  # type: ignore[return-value]

    lines = asyncio.run(script())
    expected = [(f"line-{number}", LINES[number]) for number in range(3)]
    assert [(line["line_id"], line["text"]) for line in lines] == expected  # type: ignore[index]


def test_loadtest_resume_reports_resumes_per_second(server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    args = parser.parse_args(["--url", server.ws, "--resume", "--sessions", "2", "--takes", "2", "--resumes", "3"])
    assert loadtest.run(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("2 scenes of 2 kept takes made in ")
    assert printed[1].startswith("6 resumes (2 at once) in ") and printed[1].endswith(" resumes per second")
    assert printed[3].startswith("reconnect and resume ")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def as_from_a_terminal() -> None:
    """Ctrl+C at its default in the server, as a shell starts it: a child inherits an ignored
    SIGINT, and in the whole suite something before this file leaves the test process's
    SIGINT ignored (uvicorn then stops cleanly but exits 0, restoring the ignored handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def serve(options: list[str], tmp_path: Path, env: dict[str, str] | None = None,
          log: Path | None = None) -> tuple[subprocess.Popen[str], int, dict[str, object]]:
    """`retake serve OPTIONS` as a process, once its /health answers: (process, port, health).
    With `log`, its output goes to that file (a pipe nobody reads before `stop` holds 64 KiB)."""
    port = free_port()
    command = [*RETAKE, "serve", *options, "--port", str(port), "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE if log is None else log.open("w"),
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                                         **(env or {})},
                               preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                return process, port, json.loads(response.read())
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"retake serve did not come up:\n{process.communicate()[0]}") from None
            time.sleep(0.25)


def stop(process: subprocess.Popen[str]) -> str:
    """Ctrl+C the server; its output. uvicorn shuts down cleanly, then the usual 130."""
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, (process.returncode, output)
    assert "Application shutdown complete" in output
    return output


def test_serve_warms_up_logs_and_serves(tiny_checkpoint: Path, tmp_path: Path) -> None:
    process, _, health = serve(["--checkpoint", str(tiny_checkpoint), "--device", "cpu"], tmp_path)
    try:
        assert isinstance(health["replica"], int) and health["replica"] > 0  # its id in the store
        assert health == {"status": "ok", "engine": "drama3", "demo_weights": True, "sessions": 0, "queue": 0,
                          "converse": False, "pid": process.pid, "replica": health["replica"]}
    finally:
        output = stop(process)
    assert "one decode step" in output and "DEMO WEIGHTS" in output
    assert f"sessions are stored in {tmp_path / 'data' / 'retake.sqlite3'}" in output
    assert (tmp_path / "data" / "retake.sqlite3").is_file()


def test_serve_random_weights_says_so_in_the_log_health_and_session_ready(tmp_path: Path) -> None:
    process, port, health = serve(["--random-weights", "--preset", "tiny", "--device", "cpu"], tmp_path)
    try:
        assert health["demo_weights"] is True

        async def ready() -> dict[str, object]:
            director = await Director.connect(f"ws://127.0.0.1:{port}/ws")
            message = await director.open()
            await director.close()
            return message

        assert asyncio.run(ready())["demo_weights"] is True
    finally:
        output = stop(process)
    assert "loading random weights of the tiny preset (DEMO/RANDOM: its audio is noise) on cpu" in output
    assert "DEMO WEIGHTS (RANDOM): random weights of the tiny preset, made on cpu; its audio is noise" in output


def test_serve_prints_every_threads_stack_while_it_warms_up(tmp_path: Path) -> None:
    """RETAKE_STACKS_EVERY (scripts/gpu sets it): where each thread is, from a thread of its own that
    reads the stacks under the GIL (faulthandler's timer killed servers with SIGSEGV on the H200)."""
    log = tmp_path / "serve.log"
    process, _, _ = serve(["--random-weights", "--preset", "tiny", "--device", "cpu"], tmp_path,
                          env={"RETAKE_STACKS_EVERY": "1"}, log=log)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    output = log.read_text()
    assert process.returncode == 130, output[-2000:]
    assert "Stacks after 1 s (RETAKE_STACKS_EVERY):" in output
    assert "Thread MainThread (most recent call last):" in output and "backend/cli.py" in output
    assert "print_stacks_every" not in output  # (its own thread is left out)


@pytest.mark.parametrize(("options", "message"), [
    (["--random-weights", "--device", "cpu"], "--random-weights --preset full needs a GPU (--device cuda); use "
                                              "--preset tiny on a CPU"),
    (["--random-weights", "--checkpoint", "owner/name"], "--random-weights and --checkpoint exclude each other"),
    (["--port", "99999"], "--port must be between 1 and 65535 (got 99999)"),  # before the engine loads
    (["--prefill-group", "9"], "--prefill-group must be a whole number from 1 (off) to 8"),
    (["--kernels", "deltanet_step", "fast"], "--kernels: unknown fast; choose from deltanet_step, add_rms_norm, "
                                             "moe_routing, cache_attention, prefill_norms, dense_rows, shared_beside"),
])
def test_serve_refuses_random_weights_it_cannot_run(options: list[str], message: str) -> None:
    result = subprocess.run([*RETAKE, "serve", *options], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == f"retake serve: {message}"


@pytest.mark.parametrize("bench", ["decode", "prefill", "takes"])
def test_bench_refuses_the_full_preset_on_a_cpu(bench: str) -> None:
    """Its float32 random weights took a CPU machine's 24 GiB until the kernel killed the bench."""
    result = subprocess.run([*RETAKE, "bench", bench, "--preset", "full", "--device", "cpu"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        "retake bench: --random-weights --preset full needs a GPU (--device cuda); use --preset tiny on a CPU")


def test_serve_refuses_a_missing_checkpoint(tmp_path: Path) -> None:
    result = subprocess.run([*RETAKE, "serve", "--checkpoint", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"retake serve: {tmp_path / 'nope'} is neither a checkpoint directory nor a "
                                     "Hugging Face repo id (owner/name)")  # one line, before any "loading ..."


def test_serve_refuses_a_bad_converse_checkpoint_before_drama3_loads(tmp_path: Path) -> None:
    bad = tmp_path / "personaplex"
    bad.mkdir()
    (bad / "config.json").write_text("[1, 2]")
    for folder, message in ((tmp_path / "nope", f"{tmp_path / 'nope'} is neither a checkpoint directory nor a "
                                                "Hugging Face repo id (owner/name)"),
                            (tmp_path, f"{tmp_path} has no config.json; is it a checkpoint directory?"),
                            (bad, f"{bad / 'config.json'} must hold a JSON object")):
        result = subprocess.run([*RETAKE, "serve", "--converse", str(folder), "--port", str(free_port()),
                                 "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert result.stderr.strip() == f"retake serve: {message}"  # one line: Drama 3 never started loading


def test_serve_refuses_a_port_in_use_before_loading(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*RETAKE, "serve", "--port", str(port), "--data-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"retake serve: cannot listen on 127.0.0.1:{port} (Address already in use); "
                                     "pick another --port or --host")
    assert "loading" not in result.stdout + result.stderr  # refused before the engine loaded


def test_directors_starting_together_with_prefill_groups_and_mixed_steps(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`retake serve --prefill-group 4 --mixed-step groups --early-windows on --vocoder-order arrival
    --warms-yield on --keep-warms off` on a CPU (where the six are the other way by default): the log says so, and
    three directors starting at once, then retaking while the others play, get every take (`--compile-prefill` and
    `--vocoder-compile on`, a GPU's options, change nothing here)."""
    log = tmp_path / "server.log"
    process, port, _ = serve(["--prefill-group", "4", "--mixed-step", "groups", "--early-windows", "on", "--slots", "3",
                              "--compile-prefill", "--vocoder-compile", "on", "--vocoder-order", "arrival",
                              "--warms-yield", "on", "--keep-warms", "off"],
                             tmp_path, log=log)
    try:
        parser = argparse.ArgumentParser()
        loadtest.add_arguments(parser)
        args = parser.parse_args(["--url", f"ws://127.0.0.1:{port}/ws", "--sessions", "3", "--takes", "2",
                                  "--max-new-tokens", "8", "--stagger-ms", "0", "--no-keep"])
        assert loadtest.run(args) == 0
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    printed = capsys.readouterr().out
    assert "3 sessions x 2 takes" in printed
    reasons = next(line for line in printed.splitlines() if line.startswith("finish reasons:"))
    assert set(reasons.split()[2::2]) <= {"stop", "length"}, reasons  # e.g. "finish reasons: length 3"
    output = log.read_text()
    assert "prefill groups: the next chunks of up to 4 waiting prompts run as one" in output, output[-2000:]
    assert ("mixed steps: a waiting prompt's next 256 rows ride each decode step, or the next chunks of up to 4 "
            "prompts together (8 x 64 or 4 x 128 rows)") in output, output[-2000:]
    assert "early windows: on; a window closes early where a take's client would run out of audio" in output
    assert "vocoder compiled" not in output  # (ignored on a CPU: its windows decode eagerly)
    assert "vocoder order: arrival; first windows first, then as they came" in output
    assert "warms yield: on; the next lines' warms wait while the vocoder has a window due" in output
    # The tiny model's states are small: the 1 GiB a CPU gives holds far more than two a slot.
    line = next(line for line in output.splitlines() if "for snapshots of prompt prefixes" in line)
    assert "to resume from (" in line and "under two" not in line, line
    assert "prefix cache order: least recently used (--keep-warms off)" in output
    frozen = next(line for line in output.splitlines() if "garbage collector: the warm-up's" in line)
    assert "objects frozen (gc.freeze: collections skip them)" in frozen, frozen


@pytest.mark.parametrize(("asked", "mixed_step", "mixed_group"), [
    ([], None, False), (["--mixed-step", "on"], True, False), (["--mixed-step", "groups"], True, True),
    (["--mixed-step", "off"], False, False)])
def test_mixed_step_groups_carries_several_prompts_a_step(tmp_path: Path, asked: list[str], mixed_step: bool | None,
                                                          mixed_group: bool) -> None:
    """Mixed steps carry one prompt's chunk a step unless `--mixed-step groups` (stop 57's H100: no clear gain)."""
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    settings = serve_command.settings_from(parser.parse_args(["--data-dir", str(tmp_path), *asked]))
    assert (settings.mixed_step, settings.mixed_group) == (mixed_step, mixed_group)


def test_the_prefix_cache_line_says_when_warms_will_be_evicted() -> None:
    """Stop 55's H100: 5.15 GiB of snapshots of 64 MiB of states each for 59 slots is ~82, under
    two a slot: the line says so and names the remedy; host memory for evicted ones lifts it."""
    h100 = {"prefix_cache_gib": 5.15, "prefix_cache_host_gib": 0.0, "prefix_cache_states_mib": 64.0}
    line = prefix_cache_line(h100, 59)
    assert line.startswith("5.15 GiB for snapshots of prompt prefixes (0 GiB of host memory for evicted ones); ~82 to "
                           "resume from (64 MiB of DeltaNet states each, beside their rows): under two for each of "
                           "the 59 slots"), line
    assert "--prefix-cache-host-gib" in line
    assert "under two" not in prefix_cache_line({**h100, "prefix_cache_host_gib": 32.0}, 59)
    assert prefix_cache_line({"prefix_cache_gib": 1.0}, 2).endswith("evicted ones)")  # (states unknown: nothing more)

"""The stages that serve: `retake serve` of random weights in a process of its own, `retake loadtest` against it.

serve runs a server per --serve-variant and the loads (gpu_run.LOADS, or --loads) against each
while the stage's time allows; converse runs a PersonaPlex server and conversations against it,
one joining while the others talk.

Design choices:
- Each load test's JSON is read even when the test failed or ran out of time, and summarised
  here (`load_summary`: percentiles of first audio and of the gaps, real time or not), so
  summary.json holds figures rather than every take (a small load's takes are kept one by one).
- The server's log is written into OUT as the server runs (cut to its last 2 MB at the end),
  and its telling lines go into summary.json: readiness, kernels that failed, non-finite
  logits, failed takes, the pace lines. Written live because a call that runs past its limit
  is killed whole: stop 53's two H100 calls whose servers were not ready in 195-300 s came
  back without a line of the server's log (it was copied into OUT only after the server
  stopped, which the call's limit never let happen).
- A server's stop (its stacks if it never served, SIGINT, up to 30 s for it to end) comes out
  of the stage's time (STOP_S), not after it: the summary and the log are written before the
  call's limit.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from gpu_stages import CLI, WORK, Json, RunView, Stage, StageTimeout, bench_has, read_json, wait

STOP_S = 35  # a server's stop: its stacks (3 s) if it never served, SIGINT and up to 30 s to end
LOG_BYTES = 2_000_000  # the server log kept in OUT: its last 2 MB


def percentiles(values: list[float], scale: float = 1000.0) -> Json | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:  # linear interpolation, as numpy's default
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {k: round(at(q) * scale, 1) for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metrics(port: int) -> dict[str, float]:
    """The server's /metrics as {'name{labels}': value} ({} where it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (OSError, ValueError):
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            try:
                found[name] = float(value)
            except ValueError:
                continue
    return found


PREFIX_COUNTERS = {  # a load's prefix cache figures: the counters' growth over it (/metrics, backend/metrics.py)
    "hits": 'retake_prefix_cache_lookups_total{result="hit"}',
    "partial": 'retake_prefix_cache_lookups_total{result="partial"}',
    "misses": 'retake_prefix_cache_lookups_total{result="miss"}',
    "rows_saved": 'retake_prefix_cache_rows_total{kind="saved"}',
    "rows_prefilled": 'retake_prefix_cache_rows_total{kind="prefilled"}',
    "dropped": 'retake_prefix_cache_evictions_total{kind="dropped"}',
    "spilled": 'retake_prefix_cache_evictions_total{kind="spilled"}',
}


def prefix_growth(before: dict[str, float], after: dict[str, float]) -> Json | None:
    """How the prefix cache's counters grew between two scrapes of /metrics (None: the cache is off
    or /metrics did not answer): a warm evicted before its take came shows as a partial hit."""
    if PREFIX_COUNTERS["hits"] not in after:
        return None
    return {key: int(after.get(name, 0) - before.get(name, 0)) for key, name in PREFIX_COUNTERS.items()}


def health(port: int) -> Json | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            data: Json = json.loads(response.read())
            return data
    except (OSError, ValueError):
        return None


def gaps_where(takes: list[Json]) -> dict[str, int]:
    """Where the takes' gaps above 100 ms fell: by the audio played before them, and by the take's
    place in its session (a load's first takes ask at once)."""
    gapped = [t for t in takes if t.get("first_audio_s") is not None and t["longest_gap_s"] > 0.1
              and "longest_gap_at_s" in t]
    return {"first_1s": sum(t["longest_gap_at_s"] < 1 for t in gapped),
            "1_to_3s": sum(1 <= t["longest_gap_at_s"] < 3 for t in gapped),
            "later": sum(t["longest_gap_at_s"] >= 3 for t in gapped),
            "first_takes": sum(t.get("number") == 0 for t in gapped),
            "later_takes": sum((t.get("number") or 0) > 0 for t in gapped)}


def load_summary(report: Json) -> Json:
    takes = report.get("takes", [])
    first = [t["first_audio_s"] for t in takes if t.get("first_audio_s") is not None]
    queued = [t["queued_s"] for t in takes if t.get("queued_s") is not None]
    server = [t["server_first_audio_ms"] / 1000 for t in takes if t.get("server_first_audio_ms") is not None]
    sent = [t["server_sent_ms"] / 1000 for t in takes if t.get("server_sent_ms") is not None]
    slot_waits = [t["slot_wait_ms"] / 1000 for t in takes if t.get("slot_wait_ms") is not None]
    first_windows = [t["first_window_ms"] / 1000 for t in takes if t.get("first_window_ms") is not None]
    prefills = [t["prefill_ms"] / 1000 for t in takes
                if t.get("prefill_ms") is not None and t.get("first_window_ms") is not None]
    gaps = [t["longest_gap_s"] for t in takes if t.get("first_audio_s") is not None]
    audio, wall = sum(t.get("audio_s", 0.0) for t in takes), report.get("wall_s") or 0.0
    reasons: dict[str, int] = {}
    errors: dict[str, int] = {}  # what the takes that ended with an error said
    for t in takes:
        reasons[t["finish_reason"]] = reasons.get(t["finish_reason"], 0) + 1
        if t.get("error"):
            errors[t["error"][:300]] = errors.get(t["error"][:300], 0) + 1
    return {"sessions": report.get("sessions"), "takes_per_session": report.get("takes_per_session"),
            "takes": len(takes), "wall_s": round(wall, 1), "audio_s": round(audio, 1),
            "audio_per_s": round(audio / wall, 2) if wall else None,
            "queued_ms": percentiles(queued), "first_audio_client_ms": percentiles(first),
            "first_audio_server_ms": percentiles(server), "first_audio_sent_ms": percentiles(sent),
            "slot_wait_ms": percentiles(slot_waits),  # the engine's queue: every slot taken
            # the server's first audio after the slot: the prompt's prefill, then its first frames and their vocode
            "prefill_ms": percentiles(prefills), "first_window_ms": percentiles(first_windows),
            "longest_gap_ms": percentiles(gaps), "gaps_over_100ms": sum(g > 0.1 for g in gaps),
            "gaps_over_100ms_where": gaps_where(takes),
            # the client's event loop: how late a 5 ms sleep woke (a lag near the gaps' tail is the client's)
            "client_loop_lag_ms": {k: round(v * 1000, 1) for k, v in (report.get("client_loop_lag_s") or {}).items()},
            "real_time": bool(gaps) and not reasons.get("error") and (percentiles(gaps) or {}).get("p99", 1e9) <= 100.0,
            "prompt_rows_p50": statistics.median([t["prompt_rows"] for t in takes]) if takes else None,
            "cached_rows_p50": statistics.median([t.get("cached_rows", 0) for t in takes]) if takes else None,
            "finish_reasons": reasons, "errors": errors, "failures": report.get("failures", []),
            # a small load's takes one by one: a take's first audio beside its prompt's rows, to set
            # beside `bench takes`' first audio at those rows
            "each_take": [{"prompt_rows": t["prompt_rows"], "cached_rows": t.get("cached_rows", 0),
                           "server_ms": t.get("server_first_audio_ms"),
                           "client_ms": round(t["first_audio_s"] * 1000, 1) if t.get("first_audio_s") is not None
                           else None} for t in takes] if len(takes) <= 8 else None}



def serve_stage(run: RunView, stage: Stage, log: Path, converse: bool = False) -> Json:
    """A server of random weights per --serve-variant (its extra arguments), the loads against
    each while time allows; the first server's results, the others' under "variants"."""
    if converse:
        return one_server(run, stage, log, converse=True)
    stage_end = time.monotonic() + run.limit(stage)
    results: list[Json] = []
    for number, variant in enumerate(run.variants):
        if stage_end - time.monotonic() < 60:
            results.append({"variant": variant, "skipped": "out of time"})
            continue
        results.append(one_server(run, stage, log, extra=variant.split(), number=number, stage_end=stage_end))
    if all("skipped" in result for result in results):  # (the summary said "ok" for a stage that served nothing)
        stage.status, stage.note = "timeout", "under 60 s left for a server"
    data = results[0]
    if len(results) > 1:
        data["variants"] = results[1:]
    return data


def one_server(run: RunView, stage: Stage, log: Path, converse: bool = False, extra: list[str] | None = None,
               number: int = 0, stage_end: float | None = None) -> Json:
    """A server of random weights; load tests against it while time allows; its log. A load that
    fails has every server thread's stack dumped into the log, and ends this server's loads."""
    port = free_port()
    data_dir = WORK / f"data-{port}"
    if converse:  # Drama 3 tiny: the GPU's memory is for PersonaPlex's rings
        # Drama 3 with one slot: its warm-up (compiling the tiny layers, a graph per row and KV bucket)
        # is not what this stage measures, and it took 165 s of the stage with 64 slots (2026-12-04);
        # nor its compiled vocoder: on an H100's cold cache it held the stage past its 190 s (stop 50).
        argv = [*CLI, "serve", "--converse", "--random-weights", "--preset", "tiny", "--size",
                "tiny" if run.smoke else "released", "--converse-slots", str(run.conversations()),
                "--slots", "1", "--vocoder-compile", "off", "--device", "cpu" if run.smoke else "cuda"]
    else:
        argv = [*CLI, "serve", "--random-weights", "--preset", "tiny" if run.smoke else "full",
                "--device", "cpu" if run.smoke else "cuda"]
        if run.slots:
            argv += ["--slots", str(run.slots)]
    env = {name: value for name, _, value in (word.partition("=") for word in extra or [])
           if re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) and value}  # NAME=VALUE words: the server's environment
    argv += ["--port", str(port), "--data-dir", str(data_dir), "--max-sessions", "256", "--max-queue", "512",
             *(word for word in extra or [] if word.partition("=")[0] not in env)]
    server_log = run.out / ("converse-server.log" if converse else "server.log" if not number else
                            f"server-{number + 1}.log")
    stage.commands.append(" ".join(argv))
    stage_end = (stage_end or time.monotonic() + run.limit(stage)) - STOP_S
    with server_log.open("w") as sink:
        server = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **env})
    data: Json = {"command": " ".join([*(f"{k}={v}" for k, v in env.items()), *argv]),
                  "variant": " ".join(extra or []), "loads": []}
    try:
        started = time.monotonic()
        while (found := health(port)) is None:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode} before it served")
            if time.monotonic() > stage_end:
                raise StageTimeout
            time.sleep(1)
        data["health"], data["ready_s"] = found, round(time.monotonic() - started, 1)
        if converse:  # (conversations, seconds, joining while they talk, microphones in phase)
            # 127 talking + 1 joining: the 128 slots full, and a system prompt read while 127 others talk;
            # then the same with every microphone starting when its conversation listens (--aligned)
            full = run.conversations() - 1
            loads = [(full, 10.0, 1, False), (full, 8.0, 1, True), (full // 2 + 1, 8.0, 1, False)] \
                if not run.smoke else [(1, 3.0, 1, False)]
            for sessions, seconds, joins, aligned in loads:
                left = stage_end - time.monotonic()
                if left < 30:
                    data["loads"].append({"sessions": sessions, "skipped": "out of time"})
                    continue
                report = WORK / f"converse-{sessions}{'-aligned' if aligned else ''}.json"
                report.unlink(missing_ok=True)
                talked = run.command([*CLI, "loadtest", "--converse", "--url", f"ws://127.0.0.1:{port}/ws",
                                      "--sessions", str(sessions), "--seconds", str(seconds), "--stagger-ms", "20",
                                      "--join", str(joins), *(["--aligned"] if aligned else []),
                                      "--json", str(report)], left - 10, log)
                talk: Json = read_json(report) or {"conversations": sessions}
                talk["exit_code"] = talked
                data["loads"].append(talk)
        else:
            tokens = "12" if run.smoke else "200"
            for index, (sessions, takes, think_ms, script, listen) in enumerate(run.loads):
                left = stage_end - time.monotonic()
                if left < 30:
                    data["loads"].append({"sessions": sessions, "think_ms": think_ms, "script": script,
                                          "listen": listen, "skipped": "out of time"})
                    continue
                again = run.loads[:index].count(run.loads[index])  # a load asked twice (an A/B's repeat): its own file
                report = WORK / f"load-{number}-{sessions}-{think_ms}{'-script' if script else ''}" \
                                f"{'-listen' if listen else ''}{f'-{again + 1}' if again else ''}.json"
                report.unlink(missing_ok=True)
                counted = metrics(port)
                rc = run.command([*CLI, "loadtest", "--url", f"ws://127.0.0.1:{port}/ws", "--sessions", str(sessions),
                                  "--takes", str(takes), "--max-new-tokens", tokens, "--think-ms", str(think_ms),
                                  *(["--script"] if script else []), *(["--listen"] if listen else []),
                                  "--json", str(report)], left - 10, log)
                found_report = read_json(report)
                row: Json = load_summary(found_report) if found_report else {"sessions": sessions}
                row["think_ms"], row["script"], row["listen"] = think_ms, script, listen
                row["exit_code"] = rc
                row["prefix_cache"] = prefix_growth(counted, metrics(port))
                if found_report:  # every take's figures beside the summary (tens of KB), for what the summary hides
                    shutil.copyfile(report, run.out / report.name)
                data["loads"].append(row)
                if rc is None:
                    break
                if row.get("failures"):  # sessions failed: where the server stands (its stacks), then no more loads
                    server.send_signal(signal.SIGUSR1)
                    time.sleep(3)
                    break
    finally:
        if "health" not in data and server.poll() is None:
            server.send_signal(signal.SIGUSR1)  # never ready: every thread's stack into its log (backend/cli.py)
            time.sleep(3)
        server.send_signal(signal.SIGINT)
        wait(server, 30)
        text = server_log.read_text(errors="replace")
        if len(text) > LOG_BYTES:
            server_log.write_text(text[-LOG_BYTES:])
        data["server_exit_code"] = server.returncode
        shown = r"ready on|DEMO|loading|bucket \d+ runs eagerly|kernel failed|PersonaPlex ticks|slots|Traceback|Error" \
            r"|^Thread|^Current thread|^  File"
        data["log"] = [line for line in text.splitlines() if re.search(shown, line)][:60]
        # Takes whose logits went non-finite, with the state the engine found bad (finite.py `diagnose`), and
        # takes that failed otherwise: the first ones say where it starts.
        data["non_finite"] = [line for line in text.splitlines() if "non-finite logits at position" in line][:12]
        data["pace"] = [line.split("pace: ", 1)[1] for line in text.splitlines() if "pace: " in line][-40:]
        data["pauses"] = pauses(text)
        failed_take = r"take failed|take start failed|step crashed|ended with an error"
        data["take_errors"] = [line for line in text.splitlines() if re.search(failed_take, line)][:12]
        ready = re.search(r"one decode step ([\d.?]+) ms, (\d+) slots?, peak memory ([\d.]+ GiB|n/a)", text)
        if ready:
            data["decode_step_ms"], data["slots"], data["peak_memory_gib"] = ready.groups()
    failed = [load for load in data["loads"] if load.get("exit_code") not in (0, None) or load.get("failures")]
    if failed:
        stage.status, stage.note = "failed", f"{len(failed)} load tests failed"
    return data


def pauses(text: str) -> list[str]:
    """The server's logged pauses (backend/pauses.py): long garbage collections, and event loop
    stalls each with the innermost frames of the stack that held it; the first 12."""
    found: list[str] = []
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if "garbage collection: generation" in line:
            found.append(line)
        elif "event loop held" in line:
            stack = list(itertools.takewhile(lambda frame: frame.startswith("  "), lines[at + 1:at + 17]))
            found.append(" | ".join([line, *(frame.strip() for frame in stack[-4:])]))
    return found[:12]


def converse_stage(run: RunView, stage: Stage, log: Path) -> Json | None:
    if not bench_has("serve", "--size"):
        stage.note = "retake serve has no --size (random PersonaPlex weights) in this checkout"
        return None
    return serve_stage(run, stage, log, converse=True)

"""The stages of `scripts/gpu OUTDIR`: every GPU measurement of Retake in one run, one JSON summary.

    scripts/gpu OUT                     # on the GPU machine (wheels from .whl/ installed first)
    scripts/gpu OUT --smoke             # on a CPU: every stage's command at the tiny size, to catch typos
    scripts/gpu OUT --stages serve,takes --budget 500 --slots 64

The default stages fit one 10-minute command (--budget 555 s: 400 s for Drama 3 and 155 s
for PersonaPlex; each stage's limit in LIMITS_S); `retake` runs only when asked
(`--stages retake`, about 3 minutes).

Stages, in this order (each within its own time limit and what is left of --budget; a stage
that fails or runs out of time is recorded and the next one runs):

- env: torch, CUDA, the GPU, package versions
- pytest: `pytest -m "gpu or kernel"` over every test file with GPU or kernel tests, a process per
  file (verbose; junit once it ends; each failure printed as it happens: a device-side assert
  aborts its process), the kernels, the decoder's and the fast path's files first
  (FIRST_TESTS); `--tests A,B` runs those files instead
- codec: `retake bench codec --random-weights --preset full --window`: a long window's graph with the
  decoder's Snakes in one pass and op by op, and 64-, 10- and 1-frame windows with the whole decode
  compiled (`retake serve --vocoder-compile on`, the default) and not, and the long window's
  kernels (codec-profile.txt); with --codec-sweep instead `bench codec --sweep` (each frame
  count's window graph, cuDNN's heuristics and its benchmark mode)
- takes: `retake bench takes --random-weights --preset full --device cuda --profile FILE`:
  decode (graph, floor), first audio, prefill, the step with 1..64 of 64 slots decoding,
  vocode (the bench writes its JSON after each part: a timeout keeps what was measured)
- serve: `retake serve --random-weights --preset full`, then `retake loadtest` at 1 session
  (take.queued, first audio at client and server, gaps) and at 16 and 64 (the concurrency table)
- kernels: `retake bench kernels` (each decode kernel against its torch reference)
- numerics: `retake bench numerics`: compiled vs eager in float32, per experts path and TF32
- retake (only with --stages): `retake bench retake --random-weights --preset full --device
  cuda --repeats 5`: first audio of a retake with 0 / 1,000 / 4,000 rows of history, prefix cache on and off;
  one retake per size profiled into retake-profile.txt (its ranges and top ops)
- personaplex: `retake bench personaplex --size released` at 1, 8, 32, 64, 128 slots (a full
  context each, and a join's system prompt read alone; the ticks of 1 and 128 profiled part by
  part, and a prompt chunk), then encode / model / decode
  apart (`--parts`) at 1 and 64 if time is left
- converse: `retake serve --converse --random-weights --size released --preset tiny
  --converse-slots 128` (64 on a GPU under 120 GiB, an H100: 128 do not fit; Drama 3 tiny:
  the GPU's memory is PersonaPlex's) + `retake loadtest --converse` at 127 conversations
  with one joining while they talk (all the slots), the same with the microphones in phase
  (`--aligned`), then 64 with one joining if time is left (63 / 33 on the smaller GPU)

OUT gets at most 8 files: summary.json (everything measured, per stage; rewritten after
each stage, so a run cut short keeps what it measured), summary.txt (the figures that
matter, readable; also printed at the end), log.txt (each stage's output, its tail when
long), server.log (server-2.log, ... for each further --serve-variant) and converse-server.log
(the served engines' logs), profile.txt (the kernel tables of `bench takes --profile`) and
personaplex-profile.txt (`bench personaplex --profile`), codec-profile.txt (`bench codec --profile`).
Work files live in /tmp/retake-gpu.

Design choices:
- Python orchestrates (subprocesses, time limits, the server's life); scripts/gpu only
  installs the wheels and sets the environment. Standard library only.
- Every command runs in its own process with a time limit: SIGINT first (uvicorn and
  pytest stop cleanly and still write what they have), then a kill.
- --smoke runs the same stages on the CPU at the tiny preset with short settings; a stage
  that needs CUDA is skipped there with a note. So a GPU run never fails on a typo.
- torch.compile and Triton caches are shared by the stages (/tmp), so a later process
  finds the kernels an earlier one compiled.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_summary import readable  # beside this file (scripts/ is on sys.path when run as a script)

WORK = Path("/tmp/retake-gpu")
PY = sys.executable
CLI = [PY, "-m", "backend.cli"]
STAGES = ("env", "pytest", "codec", "takes", "serve", "kernels", "numerics", "retake", "personaplex", "converse")
DEFAULT_STAGES = tuple(s for s in STAGES if s != "retake")  # retake's ~3 minutes do not fit one command
# Seconds per stage, each also capped by what is left of --budget (one 10-minute command with
# the wheels' install): the default stages add up to more than the budget, so name the stages
# a call needs. A stage that ends early leaves its time to the later ones.
# The H200 runs of 2026-12-05 ran kernels past 26 s, numerics past 94 s and takes past 160 s (compiles).
LIMITS_S = {"env": 15, "pytest": 70, "codec": 120, "takes": 200, "serve": 130, "kernels": 90, "numerics": 150,
            "retake": 240, "personaplex": 75, "converse": 80}
BUDGET_S = 555.0
SMOKE_LIMITS_S = {name: 900 for name in STAGES}
LOG_TAIL = 120_000  # characters of each stage's output kept in log.txt
# (sessions, takes each, a director's pause before each take in ms, the lines written into the
# script first, each take heard to its end first) against the full-size server; the pause lets
# the server warm the next line's prompt (backend/directing/warming.py), with the line's text
# when the script holds it.
Load = tuple[int, int, int, bool, bool]
LOADS: tuple[Load, ...] = ((1, 4, 0, False, False), (1, 4, 1000, False, False), (1, 4, 1000, True, False),
                           (16, 2, 0, False, False), (64, 2, 0, False, False))
SMOKE_LOADS: tuple[Load, ...] = ((1, 2, 0, False, False), (1, 2, 200, True, True), (2, 1, 0, False, False))


def parse_loads(text: str) -> tuple[Load, ...]:
    """`--loads 1x4@1000,1x4@1000+script,16x2,64x2+listen`: sessions x takes each, @ a pause before
    each take in ms, +script: the lines written into each session's script first (loadtest
    --script), +listen: each take heard to its end before the next (loadtest --listen)."""
    loads = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)x(\d+)(?:@(\d+))?(\+script)?(\+listen)?\s*", part)
        if match is None:
            raise argparse.ArgumentTypeError(f"a load is SESSIONSxTAKES[@THINK_MS][+script][+listen], e.g. 16x2, "
                                             f"1x4@1000 or 64x2@1000+script+listen; got {part!r}")
        loads.append((int(match[1]), int(match[2]), int(match[3] or 0), match[4] is not None, match[5] is not None))
    return tuple(loads)
Json = dict[str, Any]


@dataclass
class Stage:
    name: str
    status: str = "skipped"  # ok | failed | timeout | skipped
    seconds: float = 0.0
    commands: list[str] = field(default_factory=list)
    note: str = ""


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.out, self.smoke, self.slots = args.out, args.smoke, args.slots
        self.tests: list[str] = [path for path in (args.tests or "").split(",") if path]
        self.loads: tuple[Load, ...] = args.loads or (SMOKE_LOADS if self.smoke else LOADS)
        self.variants: list[str] = args.serve_variant or [""]  # extra `retake serve` arguments, a server each
        self.kernels: list[str] | None = args.bench_kernels.split(",") if args.bench_kernels else None
        self.compile_prefill: list[str] = ["--compile-prefill"] if args.bench_compile_prefill else []
        self.codec_sweep: bool = args.codec_sweep
        self.kernel_cases: list[str] = [name for name in (args.kernel_cases or "").split(",") if name]
        self.deadline: float = time.monotonic() + float(args.budget)
        self.started = time.monotonic()
        self.limits: dict[str, float] = {**(SMOKE_LIMITS_S if self.smoke else LIMITS_S), **dict(args.limit)}
        self.summary: Json = {"smoke": self.smoke, "budget_s": args.budget, "stages": []}
        self.logs: list[str] = []
        self.current: Stage | None = None
        self.cuda = False
        self.memory_gib: float | None = None  # the GPU's (env stage)

    def conversations(self) -> int:
        """The converse stage's PersonaPlex slots: 128 (the target) where they fit (~99 GiB of state
        at the released size: an H200), 64 on a smaller GPU (an H100 refused 128), 2 in a smoke run."""
        return 2 if self.smoke else 128 if (self.memory_gib or 0) >= 120 else 64

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def command(self, argv: list[str], limit: float, log: Path, env: dict[str, str] | None = None) -> int | None:
        """Run argv to completion within `limit` s (output to `log`); its exit code, None on timeout."""
        assert self.current is not None
        self.current.commands.append(" ".join(argv))
        with log.open("a") as sink:
            process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
            return wait(process, limit)

    def stage(self, name: str, body: Callable[[Stage, Path], Json | None], needs_cuda: bool = False) -> None:
        stage = self.current = Stage(name)
        self.summary["stages"].append(stage)
        log = WORK / f"{name}.log"
        log.write_text("")
        limit = min(self.limits[name], self.left() - 15)
        if needs_cuda and not self.cuda:
            stage.note = "needs CUDA" + (" (smoke run)" if self.smoke else "")
        elif limit < min(20, self.limits[name]):  # (env's own limit is 15 s)
            stage.note = "out of time (--budget)"
        else:
            started = time.monotonic()
            stage_deadline = started + limit
            try:
                data = body(stage, log) if body is not None else None
                if data is not None:
                    self.summary[name] = data
                if stage.status == "skipped":
                    stage.status = "ok"
            except StageTimeout:
                stage.status = "timeout"
            except Exception as error:  # noqa: BLE001 - recorded; the next stage runs
                stage.status, stage.note = "failed", f"{type(error).__name__}: {error}"
            stage.seconds = round(time.monotonic() - started, 1)
            if time.monotonic() > stage_deadline + 30:
                stage.note += " (ran past its limit)"
        text = log.read_text(errors="replace")
        self.logs.append(f"===== {name}: {stage.status} in {stage.seconds} s {stage.note}\n"
                         + "\n".join(f"$ {c}" for c in stage.commands) + "\n"
                         + (text if len(text) <= LOG_TAIL else f"[... {len(text) - LOG_TAIL} characters ...]\n"
                            + text[-LOG_TAIL:]))
        print(f"[gpu] {name}: {stage.status} in {stage.seconds} s {stage.note}", flush=True)
        self.write()  # after every stage: a run cut short keeps what it measured

    def limit(self, stage: Stage) -> float:
        return max(1.0, min(self.limits[stage.name], self.left() - 15))

    def write(self) -> None:
        summary = {**self.summary, "stages": [asdict(s) for s in self.summary["stages"]],
                   "elapsed_s": round(time.monotonic() - self.started, 1)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        (self.out / "log.txt").write_text("\n\n".join(self.logs) + "\n")
        (self.out / "summary.txt").write_text(readable(json.loads(json.dumps(summary, default=str))))

    def finish(self) -> None:
        self.write()
        print(readable(json.loads((self.out / "summary.json").read_text())), flush=True)


class StageTimeout(Exception):
    pass


def wait(process: subprocess.Popen[bytes], limit: float) -> int | None:
    try:
        return process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return None


def checked(run: Run, stage: Stage, argv: list[str], log: Path, limit: float | None = None) -> None:
    """Run a command; a non-zero exit fails the stage, a timeout times it out."""
    rc = run.command(argv, run.limit(stage) if limit is None else limit, log)
    if rc is None:
        raise StageTimeout
    if rc != 0:
        stage.status, stage.note = "failed", f"exit code {rc}"


def read_json(path: Path) -> Json | None:
    try:
        data: Json = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


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


# ─── Stages ───────────────────────────────────────────────────────────────────


def env_stage(run: Run, stage: Stage, log: Path) -> Json:
    import importlib.metadata as metadata

    probe = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
             "'cuda': c, 'cuda_version': torch.version.cuda, 'gpu': torch.cuda.get_device_name() if c else None, "
             "'memory_gib': round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if c else None, "
             "'capability': list(torch.cuda.get_device_capability()) if c else None}))")
    found = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=run.limit(stage))
    stage.commands.append("python3 -c <torch probe>")
    data: Json = json.loads(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else {"error": found.stderr}
    run.cuda = bool(data.get("cuda"))
    run.memory_gib = data.get("memory_gib")
    versions: dict[str, str | None] = {}
    for name in ("triton", "fla-core", "numpy", "starlette", "uvicorn", "websockets", "sqlalchemy", "tokenizers",
                 "safetensors", "pytest"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    data.update(python=sys.version.split()[0], packages=versions, smoke=run.smoke)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        data["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        data["nvidia_smi"] = None
    log.write_text(json.dumps(data, indent=1) + "\n")
    return data


# GPU test files run first (in this order) when the stage's time limit may not reach them all:
# the kernels (no compile), the first window and graph replays, graph == eager, then the rest.
FIRST_TESTS = ("tests/engine/test_graphs_gpu.py", "tests/engine/drama3/test_decoder_gpu.py", "tests/engine/kernels/",
               "tests/engine/drama3/test_fast_gpu.py", "tests/engine/drama3/test_prefill_gpu.py",
               "tests/engine/drama3/test_prefill_groups_gpu.py", "tests/engine/drama3/test_codec_graphs_gpu.py")


def gpu_test_files() -> list[str]:
    files = sorted(str(p) for p in Path("tests").rglob("test_*.py")
                   if re.search(r"pytest\.mark\.(gpu|kernel)", p.read_text(errors="replace")))

    def rank(path: str) -> int:
        return next((i for i, first in enumerate(FIRST_TESTS) if path.startswith(first)), len(FIRST_TESTS))

    return sorted(files, key=rank)  # stable: alphabetical within a rank


def pytest_stage(run: Run, stage: Stage, log: Path) -> Json:
    files = run.tests or gpu_test_files()
    deadline = time.monotonic() + run.limit(stage)
    results: dict[str, str] = {}
    failures: list[Json] = []
    codes: list[int | None] = []
    # A process per file: a device-side assert aborts its process (stop 41 lost a whole run's
    # reasons that way); RETAKE_REPORT_NOW prints each failure as it happens (tests/conftest.py).
    for index, file in enumerate(files):
        left = deadline - time.monotonic()
        if left < 5:
            stage.note = f"out of time before {len(files) - index} files"
            break
        junit = WORK / f"pytest-{index}.xml"
        junit.unlink(missing_ok=True)
        # `kernel` tests run their Triton kernels on the GPU in-process (and in Triton's interpreter elsewhere)
        rc = run.command([PY, "-m", "pytest", "-m", "gpu or kernel", "-vv", "-p", "no:cacheprovider",
                          "-o", "timeout=240", f"--junitxml={junit}", file], left, log, {"RETAKE_REPORT_NOW": "1"})
        codes.append(rc)
        file_results, file_failures = junit_results(junit) if junit.exists() else ({}, [])
        if not junit.exists():  # aborted or timed out: what the output showed of this file
            text = log.read_text(errors="replace")
            file_results = {test: outcome for test, outcome in re.findall(
                r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", text, re.MULTILINE)
                if test.split("::")[0] == file}
        results.update(file_results)
        failures += file_failures
        if rc is None:
            stage.status = "timeout"
            break
    bad = [rc for rc in codes if rc not in (0, 5, None)]  # 5: nothing collected / all deselected
    if bad and stage.status != "timeout":
        stage.status, stage.note = "failed", f"exit codes {sorted(set(bad))}"
    return {"files": files, "exit_code": bad[0] if bad else (None if None in codes else 0), "results": results,
            "failures": failures,
            "counts": {o: sum(1 for x in results.values() if x == o) for o in ("PASSED", "FAILED", "SKIPPED", "ERROR")}}


def junit_results(junit: Path) -> tuple[dict[str, str], list[Json]]:
    """Each test's outcome in a junit file, and each failure's message and traceback."""
    failures, results = [], {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        problems = (*case.findall("failure"), *case.findall("error"))
        results[test] = "FAILED" if problems else "SKIPPED" if case.findall("skipped") else "PASSED"
        for problem in problems:
            message = (problem.get("message") or "").strip()
            failures.append({"test": test, "message": message[:2000], "detail": (problem.text or "")[-3000:]})
    return results, failures


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def health(port: int) -> Json | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            data: Json = json.loads(response.read())
            return data
    except (OSError, ValueError):
        return None


def load_summary(report: Json) -> Json:
    takes = report.get("takes", [])
    first = [t["first_audio_s"] for t in takes if t.get("first_audio_s") is not None]
    queued = [t["queued_s"] for t in takes if t.get("queued_s") is not None]
    server = [t["server_first_audio_ms"] / 1000 for t in takes if t.get("server_first_audio_ms") is not None]
    sent = [t["server_sent_ms"] / 1000 for t in takes if t.get("server_sent_ms") is not None]
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
            "longest_gap_ms": percentiles(gaps), "gaps_over_100ms": sum(g > 0.1 for g in gaps),
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


def stage_limit(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    if name not in STAGES or not seconds.replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"--limit takes STAGE=SECONDS with a stage of {', '.join(STAGES)}; "
                                         f"got {text!r}")
    return name, float(seconds)


def serve_stage(run: Run, stage: Stage, log: Path, converse: bool = False) -> Json:
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
    data = results[0]
    if len(results) > 1:
        data["variants"] = results[1:]
    return data


def one_server(run: Run, stage: Stage, log: Path, converse: bool = False, extra: list[str] | None = None,
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
    server_log = WORK / ("converse-server.log" if converse else "server.log" if not number else
                         f"server-{number + 1}.log")
    stage.commands.append(" ".join(argv))
    stage_end = stage_end or time.monotonic() + run.limit(stage)
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
            for sessions, takes, think_ms, script, listen in run.loads:
                left = stage_end - time.monotonic()
                if left < 30:
                    data["loads"].append({"sessions": sessions, "think_ms": think_ms, "script": script,
                                          "listen": listen, "skipped": "out of time"})
                    continue
                report = WORK / f"load-{number}-{sessions}-{think_ms}{'-script' if script else ''}" \
                                f"{'-listen' if listen else ''}.json"
                report.unlink(missing_ok=True)
                rc = run.command([*CLI, "loadtest", "--url", f"ws://127.0.0.1:{port}/ws", "--sessions", str(sessions),
                                  "--takes", str(takes), "--max-new-tokens", tokens, "--think-ms", str(think_ms),
                                  *(["--script"] if script else []), *(["--listen"] if listen else []),
                                  "--json", str(report)], left - 10, log)
                found_report = read_json(report)
                row: Json = load_summary(found_report) if found_report else {"sessions": sessions}
                row["think_ms"], row["script"], row["listen"] = think_ms, script, listen
                row["exit_code"] = rc
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
        (run.out / server_log.name).write_text(text[-2_000_000:])
        data["server_exit_code"] = server.returncode
        shown = r"ready on|DEMO|loading|bucket \d+ runs eagerly|kernel failed|PersonaPlex ticks|slots|Traceback|Error" \
            r"|^Thread|^Current thread|^  File"
        data["log"] = [line for line in text.splitlines() if re.search(shown, line)][:60]
        # Takes whose logits went non-finite, with the state the engine found bad (finite.py `diagnose`), and
        # takes that failed otherwise: the first ones say where it starts.
        data["non_finite"] = [line for line in text.splitlines() if "non-finite logits at position" in line][:12]
        data["pace"] = [line.split("pace: ", 1)[1] for line in text.splitlines() if "pace: " in line][-40:]
        failed_take = r"take failed|take start failed|step crashed|ended with an error"
        data["take_errors"] = [line for line in text.splitlines() if re.search(failed_take, line)][:12]
        ready = re.search(r"one decode step ([\d.?]+) ms, (\d+) slots?, peak memory ([\d.]+ GiB|n/a)", text)
        if ready:
            data["decode_step_ms"], data["slots"], data["peak_memory_gib"] = ready.groups()
    failed = [load for load in data["loads"] if load.get("exit_code") not in (0, None) or load.get("failures")]
    if failed:
        stage.status, stage.note = "failed", f"{len(failed)} load tests failed"
    return data


def bench_stage(run: Run, stage: Stage, log: Path, argv: list[str], report: Path,
                extra: Callable[[], Json] | None = None) -> Json:
    report.unlink(missing_ok=True)
    checked(run, stage, argv, log)
    data = read_json(report) or {}
    if extra is not None:
        data.update(extra())
    return data


def takes_stage(run: Run, stage: Stage, log: Path) -> Json:
    report, profile = WORK / "takes.json", run.out / "profile.txt"
    size = ["--preset", "tiny", "--device", "cpu", "--no-compile", "--steps", "3", "--slots", "4",
            "--prompt-rows", "24", "40"] if run.smoke else ["--preset", "full", "--device", "cuda", "--steps", "50"]
    kernels = ([] if run.kernels is None else ["--kernels", *run.kernels]) + run.compile_prefill
    return bench_stage(run, stage, log, [*CLI, "bench", "takes", "--random-weights", *size, *kernels, "--json",
                                         str(report), "--profile", str(profile)], report)  # --steps 50: fewer graphs


def codec_stage(run: Run, stage: Stage, log: Path) -> Json:
    report = WORK / "codec.json"
    size = ["--preset", "tiny", "--device", "cpu"] if run.smoke else ["--preset", "full", "--device", "cuda"]
    form = ["--sweep"] if run.codec_sweep else ["--window", "--profile", str(run.out / "codec-profile.txt")]
    rows = bench_stage(run, stage, log, [*CLI, "bench", "codec", "--random-weights", *size, *form, "--json",
                                         str(report)], report)
    return {"rows": rows} if isinstance(rows, list) else rows


def retake_stage(run: Run, stage: Stage, log: Path) -> Json:
    report = WORK / "retake.json"
    size = ["--preset", "tiny", "--device", "cpu", "--history-rows", "0", "200", "--turn-frames", "40",
            "--repeats", "1"] if run.smoke else ["--preset", "full", "--device", "cuda", "--repeats", "5"]
    # 5 repeats: a retake's first audio is ~12-17 ms, and one run's host jitter moved the 4,000 / 0 ratio
    # between 1.21x and 1.45x on one H100 with 3 (docs/perf.md, stop 34)
    # The served kernels, not --bench-kernels: the retake is measured as the server runs it (stop 40's
    # run with `shared_beside` installed had takes after a warm 12-30 ms slower than stop 38's without).
    kernels = run.compile_prefill
    profile = ["--profile", str(run.out / "retake-profile.txt")]  # one retake per size, its ranges and top ops
    return bench_stage(run, stage, log, [*CLI, "bench", "retake", "--random-weights", *size, *kernels, *profile,
                                         "--json", str(report)], report)


def numerics_stage(run: Run, stage: Stage, log: Path) -> Json:
    report = WORK / "numerics.json"
    device = ["--device", "cpu", "--steps", "3"] if run.smoke else ["--device", "cuda"]
    return bench_stage(run, stage, log, [*CLI, "bench", "numerics", *device, "--json", str(report)], report)


def bench_has(name: str, option: str | None = None) -> bool:
    """Whether `retake bench NAME` (or `retake serve` with `option`) exists in this checkout."""
    argv = [*CLI, "bench", "--help"] if option is None else [*CLI, name, "--help"]
    found = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return (name in found.stdout) if option is None else (option in found.stdout)


def kernels_stage(run: Run, stage: Stage, log: Path) -> Json | None:
    if not bench_has("kernels"):
        stage.note = "retake bench kernels is not in this checkout"
        return None
    report = WORK / "kernels.json"
    only = ["--only", *run.kernel_cases] if run.kernel_cases else []
    return bench_stage(run, stage, log, [*CLI, "bench", "kernels", *only, "--json", str(report)], report)


def personaplex_stage(run: Run, stage: Stage, log: Path) -> Json:
    """The bench at every slot count first; encode / model / decode apart (`--parts`) with the time left.
    Each command's JSON is read even when it ran out of time: the bench writes each size as it is timed."""
    stage_end = time.monotonic() + run.limit(stage)
    common = ["--size", "tiny", "--device", "cpu", "--ticks", "3", "--warmup", "1"] if run.smoke \
        else ["--size", "released", "--device", "cuda"]
    profile = ["--profile", str(run.out / "personaplex-profile.txt")]  # the ticks of 1 and 128, part by part
    runs = [("sizes", ["--slots", "1", "2", *profile] if run.smoke else
             ["--slots", "1", "8", "32", "64", "128", "--ticks", "50", "--warmup", "5", "--no-compare", *profile]),
            # the compiled tick against the eager one, side by side (three engines per size)
            ("parts", ["--slots", "1", "--parts"] if run.smoke else
             ["--slots", "1", "64", "--ticks", "20", "--warmup", "3", "--parts", "--compare"])]
    data: Json = {}
    for name, extra in runs:
        left = stage_end - time.monotonic()
        if left < 30:
            data[name] = {"skipped": "out of time"}
            continue
        report = WORK / f"personaplex-{name}.json"
        report.unlink(missing_ok=True)
        rc = run.command([*CLI, "bench", "personaplex", *common, *extra, "--json", str(report)], left - 5, log)
        data[name] = {**(read_json(report) or {}), "exit_code": rc}
        if rc is None:
            stage.status, stage.note = "timeout", f"{name} ran out of time"
        elif rc != 0:
            stage.status, stage.note = "failed", f"{name}: exit code {rc}"
    return data


def converse_stage(run: Run, stage: Stage, log: Path) -> Json | None:
    if not bench_has("serve", "--size"):
        stage.note = "retake serve has no --size (random PersonaPlex weights) in this checkout"
        return None
    return serve_stage(run, stage, log, converse=True)


BODIES: dict[str, tuple[Callable[[Run, Stage, Path], Json | None], bool]] = {
    "env": (env_stage, False), "pytest": (pytest_stage, False), "serve": (serve_stage, False),
    "codec": (codec_stage, False),
    "takes": (takes_stage, False), "retake": (retake_stage, False), "numerics": (numerics_stage, False),
    "kernels": (kernels_stage, True),
    "personaplex": (personaplex_stage, False), "converse": (converse_stage, False),
}


def call(body: Callable[[Run, Stage, Path], Json | None], run: Run, stage: Stage, log: Path) -> Json | None:
    return body(run, stage, log)


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="where summary.json and the logs go")
    parser.add_argument("--smoke", action="store_true", help="the tiny preset on the CPU: check every command line")
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                        help=f"comma-separated, of {', '.join(STAGES)} (default all but retake)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the whole run (default {BUDGET_S:.0f} on a GPU, 3600 with --smoke)")
    parser.add_argument("--slots", type=int, default=None, help="retake serve --slots (default: the server's)")
    parser.add_argument("--tests", default=None, metavar="PATHS",
                        help="the pytest stage's files, comma-separated (default: every file with GPU tests)")
    parser.add_argument("--loads", type=parse_loads, default=None,
                        help="the serve stage's loads, e.g. 1x4@1000,1x4@1000+script,16x2,64x2+listen (sessions x "
                             "takes @ pause ms, +script: the lines written into the script first, +listen: each "
                             "take heard to its end before the next)")
    parser.add_argument("--serve-variant", action="append", default=[], metavar="ARGS",
                        help="extra `retake serve` arguments, NAME=VALUE words its environment (repeatable): the "
                             "serve stage runs a server and the loads for each, e.g. --serve-variant '' "
                             "--serve-variant '--prefix-cache-gib 0 RETAKE_CHECK_FINITE=1'")
    parser.add_argument("--bench-kernels", default=None, metavar="NAMES",
                        help="`--kernels` for the takes stage's bench, comma-separated, e.g. deltanet_step "
                             "(default: the bench's; the retake stage always runs the served kernels)")
    parser.add_argument("--kernel-cases", default=None, metavar="PREFIXES",
                        help="the kernels stage's cases by name prefix, comma-separated (`bench kernels --only`), "
                             "e.g. 'personaplex ring,dense_rows' (default: every case)")
    parser.add_argument("--codec-sweep", action="store_true",
                        help="the codec stage times the engine's window graphs by frame count, cuDNN's "
                             "heuristics against its benchmark mode (`bench codec --sweep`)")
    parser.add_argument("--bench-compile-prefill", action="store_true",
                        help="`--compile-prefill` for the takes and retake stages' benches (prefill chunks through "
                             "the compiled layers)")
    parser.add_argument("--limit", type=stage_limit, action="append", default=[], metavar="STAGE=SECONDS",
                        help="a stage's own time limit instead of LIMITS_S's (repeatable), e.g. --limit serve=250")
    # A variant of one option (`--serve-variant '--compile-prefill'`) reads to argparse as an option of its own.
    argv, rest = [], sys.argv[1:]
    while rest:
        word = rest.pop(0)
        argv.append(f"{word}={rest.pop(0)}" if word == "--serve-variant" and rest else word)
    args = parser.parse_args(argv)
    args.budget = args.budget or (3600.0 if args.smoke else BUDGET_S)
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STAGES]
    if unknown:
        parser.error(f"unknown stages {unknown}; choose from {', '.join(STAGES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    try:
        for name in ("env", *(s for s in STAGES if s in wanted and s != "env")):
            body, needs_cuda = BODIES[name]
            run.stage(name, functools.partial(call, body, run), needs_cuda)
    finally:
        run.finish()
    print(f"[gpu] summary in {args.out / 'summary.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

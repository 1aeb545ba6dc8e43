"""The bodies of scripts/gpu_run.py's stages but serve and converse (gpu_serve.py): the commands, what they wrote.

A body is `body(run, stage, log) -> Json | None`: it runs its commands through `run.command`
(within `run.limit(stage)`, their output into `log`), returns what the stage measured (summary.json
keeps it under the stage's name), and may set `stage.status` and `stage.note`; StageTimeout times
the stage out, any other exception fails it. Each body picks its sizes: the full ones on the GPU,
the tiny ones on the CPU with --smoke.

Design choices:
- Every command runs in its own process with a time limit: SIGINT first (uvicorn and
  pytest stop cleanly and still write what they have), then a kill.
- The bodies see the run as a RunView (a protocol that gpu_run.Run satisfies), so neither this
  module nor gpu_serve imports gpu_run, which imports them: the scripts import in one direction.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

WORK = Path("/tmp/retake-gpu")
PY = sys.executable
CLI = [PY, "-m", "backend.cli"]
Json = dict[str, Any]


class RunView(Protocol):
    """What a stage's body sees of the run (gpu_run.Run): its options, the GPU the env stage
    found, the stage's time limit and the command helper."""

    out: Path
    smoke: bool
    slots: int | None
    tests: list[str]
    loads: tuple[tuple[int, int, int, bool, bool], ...]  # gpu_run.Load: the serve stage's loads
    variants: list[str]
    kernels: list[str] | None
    compile_prefill: list[str]
    codec_sweep: bool
    kernel_cases: list[str]
    cuda: bool
    memory_gib: float | None

    def conversations(self) -> int: ...

    def limit(self, stage: Stage) -> float: ...

    def command(self, argv: list[str], limit: float, log: Path, env: dict[str, str] | None = None) -> int | None: ...


@dataclass
class Stage:
    name: str
    status: str = "skipped"  # ok | failed | timeout | skipped
    seconds: float = 0.0
    commands: list[str] = field(default_factory=list)
    note: str = ""


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


def checked(run: RunView, stage: Stage, argv: list[str], log: Path, limit: float | None = None) -> None:
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


def env_stage(run: RunView, stage: Stage, log: Path) -> Json:
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
# (test_mixed_gpu.py early: stop 56's grouped mixed steps, on by default, have never run on a GPU)
FIRST_TESTS = ("tests/engine/test_graphs_gpu.py", "tests/engine/drama3/test_decoder_gpu.py",
               "tests/engine/drama3/test_mixed_gpu.py", "tests/engine/kernels/",
               "tests/engine/drama3/test_fast_gpu.py", "tests/engine/drama3/test_prefill_gpu.py",
               "tests/engine/drama3/test_prefill_groups_gpu.py", "tests/engine/drama3/test_codec_graphs_gpu.py")


def gpu_test_files() -> list[str]:
    files = sorted(str(p) for p in Path("tests").rglob("test_*.py")
                   if re.search(r"pytest\.mark\.(gpu|kernel)", p.read_text(errors="replace")))

    def rank(path: str) -> int:
        return next((i for i, first in enumerate(FIRST_TESTS) if path.startswith(first)), len(FIRST_TESTS))

    return sorted(files, key=rank)  # stable: alphabetical within a rank


def pytest_stage(run: RunView, stage: Stage, log: Path) -> Json:
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



def bench_stage(run: RunView, stage: Stage, log: Path, argv: list[str], report: Path,
                extra: Callable[[], Json] | None = None) -> Json:
    report.unlink(missing_ok=True)
    checked(run, stage, argv, log)
    data = read_json(report) or {}
    if extra is not None:
        data.update(extra())
    return data


def takes_stage(run: RunView, stage: Stage, log: Path) -> Json:
    report, profile = WORK / "takes.json", run.out / "profile.txt"
    size = ["--preset", "tiny", "--device", "cpu", "--no-compile", "--steps", "3", "--slots", "4",
            "--prompt-rows", "24", "40"] if run.smoke else ["--preset", "full", "--device", "cuda", "--steps", "50"]
    kernels = ([] if run.kernels is None else ["--kernels", *run.kernels]) + run.compile_prefill
    return bench_stage(run, stage, log, [*CLI, "bench", "takes", "--random-weights", *size, *kernels, "--json",
                                         str(report), "--profile", str(profile)], report)  # --steps 50: fewer graphs


def codec_stage(run: RunView, stage: Stage, log: Path) -> Json:
    report = WORK / "codec.json"
    size = ["--preset", "tiny", "--device", "cpu"] if run.smoke else ["--preset", "full", "--device", "cuda"]
    form = ["--sweep"] if run.codec_sweep else ["--window", "--profile", str(run.out / "codec-profile.txt")]
    rows = bench_stage(run, stage, log, [*CLI, "bench", "codec", "--random-weights", *size, *form, "--json",
                                         str(report)], report)
    return {"rows": rows} if isinstance(rows, list) else rows


def retake_stage(run: RunView, stage: Stage, log: Path) -> Json:
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


def numerics_stage(run: RunView, stage: Stage, log: Path) -> Json:
    report = WORK / "numerics.json"
    device = ["--device", "cpu", "--steps", "3"] if run.smoke else ["--device", "cuda"]
    return bench_stage(run, stage, log, [*CLI, "bench", "numerics", *device, "--json", str(report)], report)


def bench_has(name: str, option: str | None = None) -> bool:
    """Whether `retake bench NAME` (or `retake serve` with `option`) exists in this checkout."""
    argv = [*CLI, "bench", "--help"] if option is None else [*CLI, name, "--help"]
    found = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return (name in found.stdout) if option is None else (option in found.stdout)


def kernels_stage(run: RunView, stage: Stage, log: Path) -> Json | None:
    if not bench_has("kernels"):
        stage.note = "retake bench kernels is not in this checkout"
        return None
    report = WORK / "kernels.json"
    only = ["--only", *run.kernel_cases] if run.kernel_cases else []
    return bench_stage(run, stage, log, [*CLI, "bench", "kernels", *only, "--json", str(report)], report)


def personaplex_stage(run: RunView, stage: Stage, log: Path) -> Json:
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

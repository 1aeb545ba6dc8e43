"""The stages of `scripts/gpu OUTDIR`: every GPU measurement of Retake in one run, one JSON summary.

    scripts/gpu OUT                     # on the GPU machine (wheels from .whl/ installed first)
    scripts/gpu OUT --smoke             # on a CPU: every stage's command at the tiny size, to catch typos
    scripts/gpu OUT --stages serve,takes --budget 500 --slots 64

The default stages fit one 10-minute command (--budget 555 s: 400 s for Drama 3 and 155 s
for PersonaPlex; each stage's limit in LIMITS_S, the last stage's what the budget leaves
unless `--limit` names it); `retake` runs only when asked (`--stages retake`, about 3 minutes).

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

The stages' bodies are in gpu_stages.py and gpu_serve.py; this file parses the arguments,
runs the stages in order within their limits and writes the summary.

Design choices:
- Python orchestrates (subprocesses, time limits, the server's life); scripts/gpu only
  installs the wheels and sets the environment. Standard library only.
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
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

# beside this file (scripts/ is on sys.path when run as a script)
from gpu_serve import converse_stage, serve_stage
from gpu_stages import (
    WORK,
    Json,
    Stage,
    StageTimeout,
    codec_stage,
    env_stage,
    kernels_stage,
    numerics_stage,
    personaplex_stage,
    pytest_stage,
    retake_stage,
    takes_stage,
    wait,
)
from gpu_summary import readable

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


def stage_limit(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    if name not in STAGES or not seconds.replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"--limit takes STAGE=SECONDS with a stage of {', '.join(STAGES)}; "
                                         f"got {text!r}")
    return name, float(seconds)



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


BODIES: dict[str, tuple[Callable[[Run, Stage, Path], Json | None], bool]] = {
    "env": (env_stage, False), "pytest": (pytest_stage, False), "serve": (serve_stage, False),
    "codec": (codec_stage, False),
    "takes": (takes_stage, False), "retake": (retake_stage, False), "numerics": (numerics_stage, False),
    "kernels": (kernels_stage, True),
    "personaplex": (personaplex_stage, False), "converse": (converse_stage, False),
}


def call(body: Callable[[Run, Stage, Path], Json | None], run: Run, stage: Stage, log: Path) -> Json | None:
    return body(run, stage, log)


def stage_limits(order: list[str], limits: dict[str, float], asked: dict[str, float],
                 budget: float) -> dict[str, float]:
    """Each stage's limit: LIMITS_S share a budget among stages, so the last one run gets the
    whole budget (what the earlier ones leave) unless `--limit` (`asked`) names it. Stop 54's
    lone pytest stage stopped at its 70 s share of a 290 s budget."""
    last = order[-1]
    return {**limits, last: asked.get(last, budget)}


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
    order = ["env", *(s for s in STAGES if s in wanted and s != "env")]
    run.limits = stage_limits(order, run.limits, dict(args.limit), float(args.budget))
    try:
        for name in order:
            body, needs_cuda = BODIES[name]
            run.stage(name, functools.partial(call, body, run), needs_cuda)
    finally:
        run.finish()
    print(f"[gpu] summary in {args.out / 'summary.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`retake bench WHAT ...`: benchmarks that print a table and optionally write JSON.

Each benchmark lives in engine/bench/ (the speech API's formats in backend/tools/) and exposes
`add_arguments(parser)` and `run(args) -> int`. Benchmarks print numbers; tests never assert on time.
"""

from __future__ import annotations

import argparse
import importlib

NAME = "bench"
HELP = ("measure speed: codec, rtf (CPU take real-time factor), slots, decode, prefill, takes, retake, kernels, "
        "personaplex, formats (the speech API's encoders); numerics (compiled vs eager, float32)")
BENCHES = {
    "codec": "engine.bench.codec",
    "rtf": "engine.bench.rtf",
    "slots": "engine.bench.slots",
    "decode": "engine.bench.drama3",
    "prefill": "engine.bench.drama3",
    "takes": "engine.bench.drama3",
    "kernels": "engine.bench.kernels",
    "retake": "engine.bench.retake",
    "personaplex": "engine.bench.personaplex",
    "numerics": "engine.bench.numerics",
    "formats": "backend.tools.formats_bench",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="WHAT")
    for name, module_name in BENCHES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue  # not built yet
        bench = sub.add_parser(name, help=getattr(module, "HELP", name))
        module.add_arguments(bench)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(BENCHES[args.bench]).run(args) or 0)

"""`retake make-checkpoint KIND DIR [--seed N]`: write a tiny random-weight checkpoint.

The files are in exactly the released on-disk layout (config.json, sharded safetensors
with the original key names, tokenizer, codec), so the real loading code reads them.
The weights are random: the audio they make is noise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "make-checkpoint"
HELP = "write a tiny random-weight checkpoint in the real on-disk layout"
KINDS = {"tiny": "engine.drama3.tiny", "personaplex-tiny": "engine.personaplex.tiny"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=sorted(KINDS), help="tiny: Drama 3; personaplex-tiny: PersonaPlex")
    parser.add_argument("dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")


def run(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(KINDS[args.kind])
    files = module.write_tiny_checkpoint(args.dir, seed=args.seed)
    print(json.dumps({"kind": args.kind, "dir": str(args.dir), "seed": args.seed,
                      "files": sorted(str(f.relative_to(args.dir)) for f in files)}))
    return 0

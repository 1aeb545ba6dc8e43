"""Options that several benchmarks share: where the weights come from, and the device.

Design choices:
- Each bench keeps its own defaults and help (a bench of the served engine defaults to the
  tiny demo, one of the released sizes to `full`): the helpers take them as arguments, so the
  options' names and behaviour are written once and `retake bench X --help` reads as before.
- `--checkpoint` and `--random-weights` exclude each other (argparse says so), so a run never
  silently times other weights than the ones asked for.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_weights(parser: argparse.ArgumentParser, *, preset: str | None, checkpoint_help: str, preset_help: str) -> None:
    """--checkpoint DIR or --random-weights, and --preset (the random weights' size)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path, help=checkpoint_help)
    source.add_argument("--random-weights", action="store_true", help="random weights made on the device")
    parser.add_argument("--preset", choices=("full", "tiny"), default=preset, help=preset_help)


def add_device(parser: argparse.ArgumentParser, *, auto: bool = True, help_text: str | None = None) -> None:
    """--device: auto (a GPU if there is one, decided when the bench runs: engine.device.pick_device),
    cpu or cuda; without `auto`, cuda or cpu with cuda the default where a GPU is visible."""
    if auto:
        parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help=help_text)
        return
    import torch  # only the benches that time model code on a fixed device ask (they import it anyway)

    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help=help_text)

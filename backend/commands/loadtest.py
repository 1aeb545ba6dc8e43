"""`retake loadtest` (not yet built)."""

from __future__ import annotations

import argparse

NAME = "loadtest"
HELP = "(not yet built)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise SystemExit("retake loadtest is not built yet")

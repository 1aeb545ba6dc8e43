"""The `retake` command line: one subcommand per module in backend/commands.

Each command module exposes `NAME`, `HELP`, `add_arguments(parser)` and
`run(args) -> int`; modules are imported lazily so `retake --help` stays fast and a
command's heavy imports (torch, uvicorn) load only when it runs. A `RequestError` or
`UsageError` raised by a command, or an OSError on a path the user gave, becomes a
one-line message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.metadata
import io
import os
import signal
import sys
import threading
import time
import traceback
from types import ModuleType

COMMANDS = ("serve", "deploy", "say", "make_checkpoint", "bench", "converse", "loadtest")


class UsageError(Exception):
    """Bad arguments or input the user can fix; printed as one line."""



def installed_version() -> str:
    """The package's version (pyproject.toml), as installed."""
    try:
        return importlib.metadata.version("retake")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run scripts/setup)"

def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = argparse.ArgumentParser(prog="retake",
                                     description="Retake: a real-time directing studio for speech models")
    parser.add_argument("--version", action="version", version=f"retake {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    for name in COMMANDS:
        module = importlib.import_module(f"backend.commands.{name}")
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        modules[module.NAME] = module
    return parser, modules


def print_stacks_every(seconds: float) -> None:
    """Every thread's stack to stderr every `seconds`, read under the GIL. (faulthandler's
    dump_traceback_later reads the other threads' frames while they run: on the H200 it
    killed servers with SIGSEGV mid-dump while torch.compile worked, 2026-12-04.)"""
    while True:
        time.sleep(seconds)
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        dump = [f"Stacks after {seconds:g} s (RETAKE_STACKS_EVERY):"]
        for ident, frame in sys._current_frames().items():
            if ident != threading.get_ident():
                dump += [f"Thread {names.get(ident, ident)} (most recent call last):", *traceback.format_stack(frame)]
        print("\n".join(dump), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    from engine.errors import RequestError

    # `kill -USR1 PID` prints every thread's stack to stderr: where a command that seems stuck
    # (a server warming up, a bench) is, without stopping it. A stderr without a file
    # descriptor (main() called in-process with stderr captured, as the tests do) has no dump.
    # RETAKE_STACKS_EVERY=SECONDS prints them every SECONDS without a signal (scripts/gpu sets
    # it: a process under a time limit shows where its time went even if it never finishes).
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (io.UnsupportedOperation, AttributeError, ValueError):
        pass
    every = float(os.environ.get("RETAKE_STACKS_EVERY") or 0)
    if every > 0:
        threading.Thread(target=print_stacks_every, args=(every,), name="stacks", daemon=True).start()

    try:
        return int(modules[args.command].run(args) or 0)
    except (RequestError, UsageError) as error:
        print(f"retake {args.command}: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a path the user gave cannot be read or written
        where = f" {error.filename}" if error.filename else ""
        print(f"retake {args.command}: cannot use{where}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Run the imported module's main, so `python -m backend.cli` and the `retake` script
    # catch the same UsageError class (commands import it from backend.cli, not __main__).
    from backend.cli import main as cli_main

    sys.exit(cli_main())

"""`retake serve --gpus 0,1,...` (or `--replicas N`): one `retake serve` process per GPU on this host,
on consecutive ports, sharing one store; a load balancer in front (deploy/) spreads the sockets.

Design choices:
- A replica is a whole `retake serve` child process (its own engine, CUDA context and event
  loop), started with CUDA_VISIBLE_DEVICES naming its one GPU. The parent starts, watches and
  stops them; no socket passes through it.
- Replica k listens on `--port` + k and gets the parent's other options (so every replica
  uses the same `--database`, or the same SQLite file under `--data-dir`; the store
  coordinates them, backend/replicas.py). Its log lines start `[retake k]`.
- A replica that exits while the parent runs (a crash, an out-of-memory kill, an operator's
  SIGTERM to restart it) is started again after `RESTART_S`; one that exits 2 (a usage error:
  a bad checkpoint, a port in use, a database it cannot open) stops them all with exit 2,
  since it would fail again the same way.
- SIGTERM is passed to every replica (each drains: backend/draining.py) and the parent waits
  for them; SIGINT stops them at once. Children run in their own session, so a terminal's
  Ctrl-C reaches them once, through the parent, and each asks the kernel for SIGTERM should
  the parent die without a word (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

log = logging.getLogger("retake")
RESTART_S = 2.0  # pause before starting a replica that exited again
SUPERVISOR_OPTIONS = ("help", "gpus", "replicas", "port")  # not passed on to the replicas


@dataclass
class Replica:
    index: int
    gpu: str | None  # CUDA_VISIBLE_DEVICES, or None on the CPU
    port: int
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None


def serve_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The `retake serve` options that differ from their defaults, as a command line (for a replica)."""
    argv: list[str] = []
    for action in parser._actions:  # argparse lists its options nowhere public
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or action.dest in SUPERVISOR_OPTIONS or value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # a switch
            argv.append(flag)
        elif isinstance(value, list):  # repeatable
            for item in value:
                argv += [flag, str(item)]
        elif action.nargs == "?" and value == action.const:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def dies_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A subprocess preexec_fn: the child gets `sig` when its parent dies (Linux; elsewhere nothing).
    Only for a parent without threads (preexec_fn runs between fork and exec)."""
    def ask() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # 1: PR_SET_PDEATHSIG
        except OSError:
            pass

    return ask


def start(replica: Replica, argv: list[str], host: str) -> None:
    env = {**os.environ, "RETAKE_REPLICA": str(replica.index), "PYTHONUNBUFFERED": "1"}
    if replica.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = replica.gpu
    command = [sys.executable, "-m", "backend.cli", "serve", *argv, "--host", host, "--port", str(replica.port)]
    replica.process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=dies_with_parent())
    replica.restart_at = None
    where = "the CPU" if replica.gpu is None else f"GPU {replica.gpu}"
    log.info("replica %d on %s: http://%s:%d (pid %d)", replica.index, where, host, replica.port, replica.process.pid)


def supervise(replicas: list[Replica], argv: list[str], host: str) -> int:
    """Run the replicas until SIGTERM or SIGINT (then stop them and return 0), or one exits 2 (return 2)."""
    stopping: list[int] = []

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        stopping.append(sig)
        log.info("stopping %d replicas (%s)", len(replicas), "they drain first" if sig == signal.SIGTERM else "now")
        for replica in replicas:
            if replica.process is not None and replica.process.poll() is None:
                replica.process.send_signal(sig)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for replica in replicas:
            start(replica, argv, host)
        while True:
            running = 0
            for replica in replicas:
                code = None if replica.process is None else replica.process.poll()
                if replica.process is not None and code is None:
                    running += 1
                    continue
                if stopping:
                    continue
                if code == 2:
                    log.error("replica %d cannot start (see above); stopping the others", replica.index)
                    on_signal(signal.SIGINT, None)
                    for other in replicas:
                        if other.process is not None:
                            other.process.wait()
                    return 2
                if replica.restart_at is None:
                    log.warning("replica %d exited (%s); starting it again in %gs", replica.index,
                                f"signal {-code}" if code is not None and code < 0 else f"code {code}", RESTART_S)
                    replica.restart_at = time.monotonic() + RESTART_S
                elif time.monotonic() >= replica.restart_at:
                    start(replica, argv, host)
                    running += 1
            if stopping and running == 0:
                return 0
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

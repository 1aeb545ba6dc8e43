"""What the end-to-end tests share besides fixtures: a real `retake serve` subprocess (exactly as a
user starts it) on a free port, which a test may restart, and a playwright-core script run against it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "e2e"


class Server:
    """`retake serve OPTIONS` on a fixed free port and data directory, which a test may stop and start
    again (a server restart, as a deployment does it); its log accumulates in tmp_path/serve.log."""

    def __init__(self, tmp_path: Path, options: tuple[str, ...]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "backend.cli", "serve", *options, "--port", str(self.port),
                        "--data-dir", str(tmp_path / "data")]
        self.log_path = tmp_path / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300  # loading and warming the engines on two shared cores
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"retake serve exited with {self.process.returncode}:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"retake serve did not answer /health in 300 s:\n{self.log_path.read_text()}")
            time.sleep(0.5)

    def stop(self, crash: bool = False) -> None:
        """Stop the server as an operator does (SIGTERM: it drains, finishing the takes under way;
        SIGKILL after 30 s), or, with `crash`, as a crash does (SIGKILL at once)."""
        if self.process is None:
            return
        self.process.kill() if crash else self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@contextmanager
def serving(tmp_path: Path, *options: str) -> Iterator[Server]:
    """`retake serve OPTIONS` on a free port until the block ends; yields the Server (its `url`). Its
    log is printed at the end (pytest shows it when the test fails)."""
    server = Server(tmp_path, options)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        print(f"retake serve log (last lines):\n{server.log_path.read_text()[-4000:]}")


def run_page_script(script: str, server: Server, out: Path, chromium: Path, timeout: float,
                    artifacts: Callable[[str], str] = lambda name: name, options: tuple[str, ...] = ()
                    ) -> dict[str, Any]:
    """node tests/e2e/SCRIPT against the server; copies its screenshots and result to build/e2e (named
    by `artifacts`) and returns its result.json, failing the test when the script failed.

    The script may ask for the server to be stopped, crashed or started again: it prints `@@server stop`,
    `@@server crash` or `@@server start` on a line of its own and waits for `ok` on its stdin (tests/e2e/lib.mjs
    `serverControl`)."""
    out.mkdir(exist_ok=True)
    command = ["node", f"tests/e2e/{script}", "--url", server.url, "--out", str(out), "--chromium", str(chromium),
               *options]
    lines: list[str] = []
    with subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1) as run:
        assert run.stdin is not None and run.stdout is not None
        # A watchdog: past the timeout the script is killed, which ends the loop below.
        timer = threading.Timer(timeout, run.kill)
        timer.start()
        try:
            for line in run.stdout:
                lines.append(line)
                if line.startswith("@@server "):
                    action = line.split()[1]
                    server.start() if action == "start" else server.stop(crash=action == "crash")
                    run.stdin.write("ok\n")
                    run.stdin.flush()
        finally:
            timer.cancel()
        returncode = run.wait()
    print("".join(lines))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for path in out.glob("*"):
        if path.suffix == ".png" or path.name == "result.json":
            shutil.copy(path, ARTIFACTS / artifacts(path.name))
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert returncode == 0 and result["ok"], result.get("error")
    return result

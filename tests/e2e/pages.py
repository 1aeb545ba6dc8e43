"""What the end-to-end tests share besides fixtures: a real `retake serve` subprocess (exactly as a
user starts it) on a free port, and a playwright-core script run against it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "e2e"


@contextmanager
def serving(tmp_path: Path, *options: str) -> Iterator[str]:
    """`retake serve OPTIONS` on a free port until the block ends; yields its URL. Its log is printed
    at the end (pytest shows it when the test fails)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "backend.cli", "serve", *options, "--port", str(port),
                                    "--data-dir", str(tmp_path / "data")],
                                   cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # loading and warming the engines on two shared cores
        while True:
            if process.poll() is not None:
                pytest.fail(f"retake serve exited with {process.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"retake serve did not answer /health in 300 s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        print(f"retake serve log (last lines):\n{log_path.read_text()[-4000:]}")


def run_page_script(script: str, url: str, out: Path, chromium: Path, timeout: float,
                    artifacts: Callable[[str], str] = lambda name: name) -> dict[str, Any]:
    """node tests/e2e/SCRIPT against url; copies its screenshots and result to build/e2e (named by
    `artifacts`) and returns its result.json, failing the test when the script failed."""
    out.mkdir(exist_ok=True)
    run = subprocess.run(["node", f"tests/e2e/{script}", "--url", url, "--out", str(out), "--chromium", str(chromium)],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    print(run.stdout, run.stderr, sep="\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for path in out.glob("*"):
        if path.suffix == ".png" or path.name == "result.json":
            shutil.copy(path, ARTIFACTS / artifacts(path.name))
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert run.returncode == 0 and result["ok"], result.get("error")
    return result

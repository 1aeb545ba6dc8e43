"""End to end: the built conversation page (converse.html) in Debian's Chromium against a real
`retake serve --converse` (a subprocess, exactly as a user starts it: the tiny Drama 3
checkpoint for the studio, PersonaPlex's tiny demo checkpoint for the conversation).

tests/e2e/converse.mjs drives the page with playwright-core; Chromium's fake microphone is the
user. It checks the agent's audio frames on the wire against docs/protocol.md §9 (take 0,
consecutive seq, start_sample = seq × 1920, 1920 samples each, at least 2 s), the page's tick
counter and text against the wire, that no mic audio goes up before `converse.listening`, and
that Stop closes the socket and releases the mic. The screenshot is left in
build/e2e/converse.png.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "e2e"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _page_is_stale() -> bool:
    built = ROOT / "frontend" / "dist" / "converse.html"
    if not built.is_file():
        return True
    sources = [ROOT / "frontend" / "index.html", ROOT / "frontend" / "converse.html", ROOT / "frontend" / "vite.config.ts",
               *(ROOT / "frontend" / "src").rglob("*")]
    return max(p.stat().st_mtime for p in sources if p.is_file()) > built.stat().st_mtime


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium and scripts/test could not install it "
                    "(it needs root and apt); install it with: apt-get install chromium")
    return CHROMIUM


@pytest.fixture(scope="module")
def page_build() -> None:
    if shutil.which("node") is None or not (ROOT / "node_modules" / "playwright-core").is_dir():
        pytest.fail("the e2e test needs Node 20 and the front-end packages: run scripts/setup")
    if _page_is_stale():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=ROOT, check=True, timeout=300)


@pytest.fixture()
def serve_converse(tiny_checkpoint: Path, tmp_path: Path) -> Iterator[str]:
    """`retake serve --converse` on the tiny checkpoints, on a free port, until the test ends."""
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "backend.cli", "serve", "--converse", "--checkpoint", str(tiny_checkpoint),
             "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # loading and warming two engines on two shared cores
        while True:
            if process.poll() is not None:
                pytest.fail(f"retake serve exited with {process.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        assert json.load(response)["converse"] is True
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
        print(f"retake serve log (last lines):\n{log_path.read_text()[-4000:]}")  # shown when the test fails


def test_conversation_in_chromium(chromium: Path, page_build: None, serve_converse: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run(["node", "tests/e2e/converse.mjs", "--url", serve_converse, "--out", str(out),
                          "--chromium", str(chromium)],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    print(run.stdout, run.stderr, sep="\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in ("converse.png", "failure.png", "result.json"):
        if (out / name).is_file():
            shutil.copy(out / name, ARTIFACTS / ("converse-" + name if name != "converse.png" else name))
    result = json.loads((out / "result.json").read_text())
    assert run.returncode == 0 and result["ok"], result.get("error")
    assert result["frames"] >= 25 and result["micFrames"] > 0
    screenshot = (ARTIFACTS / "converse.png").read_bytes()
    assert screenshot.startswith(b"\x89PNG") and len(screenshot) > 10_000

"""End to end: the built studio in Debian's Chromium against a real `retake serve` on the tiny
checkpoint (a subprocess, exactly as a user starts it).

tests/e2e/studio.mjs drives the page with playwright-core and checks what only a browser can:
the samples the player worklet rendered equal the PCM the server sent (sample-exact, no gap),
keep and history, reload and resume, export, the script on the server (a line never taken and a
new order come back in a second browser with a fresh profile, and the history panel follows the
order). This file starts the server, runs the script, and
then checks the exported WAV here, independently of the page's own WAV code: Python's `wave`
reads it, and its samples must be the kept takes' PCM as it came over the socket, in script
order, with the chosen gap. The screenshot is left in build/e2e/studio.png.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "e2e"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _studio_is_stale() -> bool:
    built = ROOT / "frontend" / "dist" / "index.html"
    if not built.is_file():
        return True
    sources = [ROOT / "frontend" / "index.html", *(ROOT / "frontend" / "src").rglob("*")]
    return max(p.stat().st_mtime for p in sources if p.is_file()) > built.stat().st_mtime


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium and scripts/test could not install it "
                    "(it needs root and apt); install it with: apt-get install chromium")
    return CHROMIUM


@pytest.fixture(scope="module")
def studio_build() -> None:
    if shutil.which("node") is None or not (ROOT / "node_modules" / "playwright-core").is_dir():
        pytest.fail("the e2e test needs Node 20 and the front-end packages: run scripts/setup")
    if _studio_is_stale():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=ROOT, check=True, timeout=300)


@pytest.fixture()
def serve(tiny_checkpoint: Path, tmp_path: Path) -> Iterator[str]:
    """`retake serve` on the tiny checkpoint, on a free port, until the test ends."""
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "backend.cli", "serve", "--checkpoint", str(tiny_checkpoint),
             "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # loading and warming the engine on two shared cores
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
        print(f"retake serve log (last lines):\n{log_path.read_text()[-4000:]}")  # shown when the test fails


def _read_wav(path: Path) -> tuple[wave._wave_params, np.ndarray]:
    with wave.open(str(path), "rb") as w:
        params = w.getparams()
        samples = np.frombuffer(w.readframes(params.nframes), dtype="<i2")
    return params, samples


def test_studio_in_chromium(chromium: Path, studio_build: None, serve: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run(["node", "tests/e2e/studio.mjs", "--url", serve, "--out", str(out), "--chromium", str(chromium)],
                         cwd=ROOT,
                         capture_output=True, text=True, timeout=480)
    print(run.stdout, run.stderr, sep="\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in ("studio.png", "failure.png", "result.json"):
        if (out / name).is_file():
            shutil.copy(out / name, ARTIFACTS / name)
    result = json.loads((out / "result.json").read_text())
    assert run.returncode == 0 and result["ok"], result.get("error")

    # The export, read by Python's wave module: the kept takes as sent on the socket, in
    # script order, with the gap between them.
    exported = result["export"]
    params, samples = _read_wav(Path(exported["path"]))
    assert (params.nchannels, params.sampwidth, params.framerate) == (1, 2, exported["sampleRate"])
    takes = [np.fromfile(out / f"take-{take_id}.pcm", dtype="<i2") for take_id in exported["takes"]]
    gap = np.zeros(round(exported["gapMs"] / 1000 * exported["sampleRate"]), dtype="<i2")
    expected = np.concatenate([takes[0], gap, takes[1]])
    assert samples.shape == expected.shape
    np.testing.assert_array_equal(samples, expected)
    assert all(t.size > 0 and np.any(t != 0) for t in takes)

    screenshot = (ARTIFACTS / "studio.png").read_bytes()
    assert screenshot.startswith(b"\x89PNG") and len(screenshot) > 10_000

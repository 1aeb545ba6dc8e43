"""End to end: the built studio in Debian's Chromium against a real `retake serve` on the tiny
checkpoint (a subprocess, exactly as a user starts it).

tests/e2e/studio.mjs drives the page with playwright-core and checks what only a browser can:
the samples the player worklet rendered equal the PCM the server sent (sample-exact, no gap),
keep and history, reload and resume, export, the script on the server (a line never taken and a
new order come back in a second browser with a fresh profile, and the history panel follows the
order), and a scene with two characters directed through to a server restart in the middle of a
take (tests/e2e/scene.mjs, which the script asks this file to stop and start the server for). This
file starts the server, runs the script, and
then checks the exported WAV here, independently of the page's own WAV code: Python's `wave`
reads it, and its samples must be the kept takes' PCM as it came over the socket, in script
order, with the chosen gap. The screenshot is left in build/e2e/studio.png.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from pages import ARTIFACTS, run_page_script, serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOKEN = "e2e-studio-token"


def _read_wav(path: Path) -> tuple[wave._wave_params, np.ndarray]:
    with wave.open(str(path), "rb") as w:
        params = w.getparams()
        samples = np.frombuffer(w.readframes(params.nframes), dtype="<i2")
    return params, samples


def test_studio_in_chromium(chromium: Path, pages_built: None, tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # With --token: the page must carry it on the socket and on every fetch of take audio
    # (reload, export), and never in a URL.
    with serving(tmp_path, "--checkpoint", str(tiny_checkpoint), "--token", TOKEN) as server:
        result = run_page_script("studio.mjs", server, out, chromium, 480, options=("--token", TOKEN))
        log = server.log_path.read_text()
    assert "GET /sessions/" in log and TOKEN not in log

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

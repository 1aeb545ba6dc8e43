"""End to end: the built conversation page (converse.html) in Debian's Chromium against a real
`retake serve --converse` (a subprocess, exactly as a user starts it: the tiny Drama 3
checkpoint for the studio, PersonaPlex's tiny demo checkpoint for the conversation).

tests/e2e/conversation.mjs drives the page with playwright-core; Chromium's fake microphone is the
user. It checks the agent's audio frames on the wire against docs/protocol.md §9 (take 0,
consecutive seq, start_sample = seq × 1920, 1920 samples each, at least 2 s), the page's tick
counter and text against the wire, that no mic audio goes up before `converse.listening`, and
that Stop closes the socket and releases the mic. The screenshot is left in
build/e2e/conversation.png.
"""

from __future__ import annotations

import json
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest
from pages import ARTIFACTS, run_page_script, serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_conversation_in_chromium(chromium: Path, pages_built: None, tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serving(tmp_path, "--converse", "--checkpoint", str(tiny_checkpoint)) as server:
        with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
            assert json.load(response)["converse"] is True
        result = run_page_script("conversation.mjs", server, tmp_path / "out", chromium, timeout=180,
                                 artifacts=lambda name: name if name == "conversation.png" else f"conversation-{name}")
    assert result["frames"] >= 25 and result["micFrames"] > 0

    # Save: a stereo 24 kHz WAV, read by Python's wave module: the mic as sent on the left, the
    # agent as received on the right, tick by tick, the shorter side padded with silence.
    out = tmp_path / "out"
    assert result["saved"].startswith("conversation-") and result["saved"].endswith(".wav")
    with wave.open(str(out / "conversation.wav"), "rb") as saved:
        assert (saved.getnchannels(), saved.getsampwidth(), saved.getframerate()) == (2, 2, 24000)
        stereo = np.frombuffer(saved.readframes(saved.getnframes()), dtype="<i2").reshape(-1, 2)
    user, agent = (np.fromfile(out / f"{side}.pcm", dtype="<i2") for side in ("user", "agent"))
    assert len(stereo) == max(len(user), len(agent)) and len(agent) == 1920 * result["frames"]
    np.testing.assert_array_equal(stereo[:len(user), 0], user)
    np.testing.assert_array_equal(stereo[:len(agent), 1], agent)
    assert not stereo[len(user):, 0].any() and not stereo[len(agent):, 1].any()
    screenshot = (ARTIFACTS / "conversation.png").read_bytes()
    assert screenshot.startswith(b"\x89PNG") and len(screenshot) > 10_000

"""`retake converse` end to end on the tiny checkpoint: agent WAV, transcript, timing line, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile

from backend.cli import main


def user_track(path: Path, seconds: float, rate: int) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32),
                    rate)


def test_converse_writes_the_agent_side(personaplex_checkpoint: Path, tmp_path: Path, capsys):
    user_track(tmp_path / "user.wav", 1.3, 16000)  # not 24 kHz, not whole frames
    args = ["converse", "--checkpoint", str(personaplex_checkpoint), "--input", str(tmp_path / "user.wav"),
            "-o", str(tmp_path / "out" / "agent.wav"), "--transcript-out", str(tmp_path / "out" / "agent.txt"),
            "--persona", "Your name is Jane.", "--voice", "NATF2", "--seed", "5", "--threads", "1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert "random weights" in captured.err
    agent, rate = soundfile.read(tmp_path / "out" / "agent.wav", dtype="float32")
    assert rate == 24000 and agent.shape == (int(1.3 * 24000),) and agent.std() > 0
    assert report["frames"] == 17 and len(report["tick_ms"]) == 17 and report["voice"] == "NATF2"
    assert report["demo_weights"] is True and report["tick_ms_max"] >= report["tick_ms_p50"] > 0
    assert (tmp_path / "out" / "agent.txt").read_text().endswith("\n")
    assert main(args) == 0  # a seed makes the conversation reproducible
    again, _ = soundfile.read(tmp_path / "out" / "agent.wav", dtype="float32")
    assert np.array_equal(agent, again)


def test_converse_bad_requests_exit_2_with_one_line(personaplex_checkpoint: Path, tmp_path: Path, capsys):
    user_track(tmp_path / "user.wav", 0.2, 24000)
    base = ["converse", "--checkpoint", str(personaplex_checkpoint), "-o", str(tmp_path / "agent.wav")]
    cases = [
        (["--input", str(tmp_path / "missing.wav")], "does not exist"),
        (["--input", str(tmp_path / "user.wav"), "--voice", "NOBODY"], "unknown voice 'NOBODY'"),
        (["--input", str(tmp_path / "user.wav"), "--persona", "talk about music " * 60], "shorten the persona"),
        (["--input", str(tmp_path / "user.wav"), "--audio-top-k", "0"], "audio_top_k must be an integer >= 1"),
        (["--input", str(tmp_path / "user.wav"), "--checkpoint", str(tmp_path / "none")],
         "neither a checkpoint directory nor"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1] and err[-1].startswith("retake converse: ")
    assert not (tmp_path / "agent.wav").exists()

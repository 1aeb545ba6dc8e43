"""`retake say`, run as a real command: the WAV, the frames, the timings line, history and
references round trips, the demo checkpoint, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = {"prompt_rows", "prompt_ms", "prefill_ms", "first_audio_ms", "frames", "decode_frames_per_s", "total_ms"}


def say(*args: str | Path, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run([sys.executable, "-m", "backend.cli", "say", "--threads", "1", *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def timings_of(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1  # one JSON line on stdout, nothing else
    return json.loads(lines[0])


def test_take_history_and_reference_round_trip(tiny_checkpoint, tmp_path):
    wav, npy = tmp_path / "take.wav", tmp_path / "take.npy"
    timings = timings_of(say("--checkpoint", tiny_checkpoint, "-o", wav, "--codes-out", npy,
                             "--max-new-tokens", "14", "--seed", "4", "Places, everyone."))
    assert TIMINGS <= set(timings) and timings["finish_reason"] in ("stop", "length")
    pcm, rate = sf.read(wav, dtype="int16")
    frames = np.load(npy)
    assert rate == 44100 and pcm.ndim == 1 and len(pcm) == timings["frames"] * 2048
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert frames.shape == (timings["frames"], 11) and frames.dtype == np.int64
    assert np.array_equal(frames[:, 0], frames[:, 1] + config["semantic_start_token_id"])

    retake = tmp_path / "retake.wav"
    timings = timings_of(say("--checkpoint", tiny_checkpoint, "-o", retake, "--reference", wav,
                             "--reference-text", "Places, everyone.", "--history", "Places, everyone.", npy,
                             "--max-new-tokens", "3", "--seed", "1", "And again."))
    # The prompt holds the reference's codes and the history turn's codes.
    assert timings["prompt_rows"] > 2 * len(frames)


def test_demo_checkpoint_from_the_cache_directory(tiny_checkpoint, tmp_path):
    # Writing the demo on first use is tested with the loader (test_checkpoint.py); here the
    # cache already holds one, so the command must find it there and say it is random.
    (tmp_path / "retake").mkdir()
    (tmp_path / "retake" / "drama3-tiny").symlink_to(tiny_checkpoint)
    result = say("-o", tmp_path / "demo.wav", "--max-new-tokens", "2", "Hello.", cache=tmp_path)
    timings_of(result)
    assert "random weights" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--top-p", "2", "Hi"], "top_p must be in (0, 1]"),
    (["--temperature", "nan", "Hi"], "temperature must be in [0, 100] (got nan)"),
    (["--max-new-tokens", "5000", "Hi"], "max_new_tokens must be between 1 and 1200 (got 5000)"),  # refused, not capped
    (["--reference", "clip.wav", "Hi"], "give one --reference-text for each --reference clip"),
    (["--reference", "missing.wav", "--reference-text", "x", "Hi"], "cannot read reference clip missing.wav"),
    (["--character", "Ada", "Hi"], "--character needs --description"),
    (["--history", "Before.", "missing.npy", "Hi"], "cannot read history codes missing.npy"),
    (["--character", "Dr: Ada", "--description", "calm", "Hi"], "character.name must not contain ':'"),
    (["<|im_start|>Hi"], "text contains <|im_start|>"),
    (["--checkpoint", "no/such/dir", "Hi"], "is neither a checkpoint directory nor a Hugging Face repo id"),
])
def test_bad_request_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    from backend.cli import main

    assert main(["say", "-o", str(tmp_path / "x.wav"), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err and err.startswith("retake say: ")
    assert not (tmp_path / "x.wav").exists()


def test_bad_request_from_the_real_command(tmp_path):
    result = say("-o", tmp_path / "x.wav", "--top-k", "0", "Hi")
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == ["retake say: top_k must be between 1 and 2147483647 (got 0)"]

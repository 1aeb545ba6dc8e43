"""The caches and the take limits come from the checkpoint's own `max_position_embeddings`:
a checkpoint with fewer positions than 8,192 + 1,200 rows loads with smaller limits (the
engine's `limits`, what the server serves), and one too short for any take is refused in
one line by `retake say`, not with a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import Done, EngineSpec, HistoryTurn, RequestError, Sampling, load_engine
from engine.drama3.prompt import MAX_PROMPT_ROWS
from engine.drama3.sampling import MAX_NEW_TOKENS

ROOT = Path(__file__).resolve().parents[3]


def with_positions(checkpoint: Path, folder: Path, positions: int) -> Path:
    """A copy of the checkpoint whose config.json says `positions`."""
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = positions
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_checkpoint_with_fewer_positions_serves_takes_within_them(tiny_checkpoint: Path, tmp_path: Path) -> None:
    engine = load_engine(EngineSpec(checkpoint=with_positions(tiny_checkpoint, tmp_path / "short", 1024),
                                    device="cpu", slots=1, threads=1))
    assert (engine.limits["max_prompt_rows"], engine.limits["max_new_tokens"]) == (512, 512)
    assert engine.decoder.max_rows == 1024  # the caches: every position, none past them
    done = list(engine.generate(engine.prompt("Within the positions.", None, [], Sampling(max_new_tokens=8, seed=1))))
    assert isinstance(done[-1], Done) and done[-1].finish_reason in ("stop", "length")
    with pytest.raises(RequestError, match="max_new_tokens must be between 1 and 512"):
        engine.prompt("Too long a take.", None, [], Sampling(max_new_tokens=600))
    history = [HistoryTurn("Before.", np.zeros((engine.config.num_codebooks, 600), dtype=np.int64))]
    with pytest.raises(RequestError, match="maximum allowed length of 512 rows"):
        engine.prompt("Now.", None, history, Sampling(max_new_tokens=8))
    kept = engine.prompt("Now.", None, history, Sampling(max_new_tokens=8), drop_oldest_history=True)
    assert kept.history_used == 0


def test_a_checkpoint_with_every_position_keeps_the_full_limits(tiny_checkpoint: Path) -> None:
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=1, threads=1))
    assert (engine.limits["max_prompt_rows"], engine.limits["max_new_tokens"]) == (MAX_PROMPT_ROWS, MAX_NEW_TOKENS)
    assert engine.decoder.max_rows == MAX_PROMPT_ROWS + MAX_NEW_TOKENS


def test_a_checkpoint_too_short_for_a_take_is_refused_in_one_line(tiny_checkpoint: Path, tmp_path: Path) -> None:
    short = with_positions(tiny_checkpoint, tmp_path / "tiny", 16)
    result = subprocess.run([sys.executable, "-m", "backend.cli", "say", "--threads", "1", "--checkpoint", str(short),
                             "-o", str(tmp_path / "x.wav"), "Too short."], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "random weights" not in line]
    assert len(lines) == 1 and "max_position_embeddings is 16: too few for a take" in lines[0], result.stderr

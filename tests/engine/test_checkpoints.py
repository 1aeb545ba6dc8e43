"""Shared checkpoint pieces: a directory written once and atomically, the demo-weights flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.checkpoints import demo_weights, write_once


def test_write_once_writes_a_whole_directory_once(tmp_path: Path) -> None:
    calls = []

    def write(staging: Path) -> None:
        calls.append(staging)
        (staging / "config.json").write_text("{}")

    target = tmp_path / "cache" / "demo"
    assert write_once(target, write) == target and (target / "config.json").is_file()
    assert write_once(target, write) == target and len(calls) == 1  # written once
    assert calls[0] != target and not calls[0].exists()  # written beside it, then renamed
    assert [p.name for p in target.parent.iterdir()] == ["demo"]


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    def write(staging: Path) -> None:
        (staging / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_once(tmp_path / "demo", write)
    assert list(tmp_path.iterdir()) == []


def test_a_writer_losing_the_race_keeps_the_winners_directory(tmp_path: Path) -> None:
    target = tmp_path / "demo"

    def write(staging: Path) -> None:
        (staging / "mine").write_text("loser")
        target.mkdir()  # another process finishes first
        (target / "theirs").write_text("winner")

    assert write_once(target, write) == target
    assert [p.name for p in target.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # the loser's staging copy is gone


def test_demo_weights_is_the_config_flag(tmp_path: Path) -> None:
    assert not demo_weights(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"demo_weights": True}))
    assert demo_weights(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"demo_weights": "yes"}))
    assert not demo_weights(tmp_path)
    (tmp_path / "config.json").write_text("")  # the released PersonaPlex config.json is empty
    assert not demo_weights(tmp_path)

"""Placeholder until the codec lands: the tiny checkpoint's codec.pth (owned by the codec work)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_tiny_codec(directory: Path, seed: int = 0) -> list[Path]:
    path = Path(directory) / "codec.pth"
    torch.save({}, path)
    return [path]

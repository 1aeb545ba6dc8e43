"""The device an engine runs on, and the dtype its model takes there.

Design choices:
- "auto" is CUDA when a GPU is visible, else the CPU. Asking for CUDA without a GPU is a
  `RequestError` that says what to ask for instead, not a crash at the first kernel.
- Both engines run their language models in bfloat16 on CUDA (the released weights'
  dtype) and float32 on the CPU (CPU matmuls in bfloat16 are slow and less exact); codecs
  choose their own (codec.py, mimi.py).
"""

from __future__ import annotations

import torch

from engine.errors import RequestError

DEVICES = ("auto", "cpu", "cuda")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in DEVICES:
        raise RequestError(f"device must be auto, cpu or cuda; got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise RequestError("device cuda was asked for but no CUDA GPU is available; use --device cpu")
    return torch.device(name)


def model_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32

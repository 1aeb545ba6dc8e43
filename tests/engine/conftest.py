"""Fixtures the engine's tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def exact_float32() -> Iterator[None]:
    """TF32 off everywhere (cuDNN allows it by default, and picks its algorithm by batch size) and
    matmuls at full float32: float32 comparisons (batched vs single, graph vs eager, compiled vs
    eager) are then down to summation order. Restored afterwards."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])

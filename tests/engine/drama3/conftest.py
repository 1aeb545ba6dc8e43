"""Fixtures the Drama 3 engine's tests share."""

from __future__ import annotations

import pytest

from engine import EngineSpec, load_engine


@pytest.fixture(scope="module")
def gpu_engine(tiny_checkpoint):
    """The tiny checkpoint's engine on the GPU, 4 slots, its graphs captured (a module's own)."""
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cuda", slots=4))
    engine.warm_up()  # captures the graphs
    return engine


@pytest.fixture(scope="module")
def cpu_exact(tiny_checkpoint):
    """The tiny checkpoint's engine on the CPU, in float32: the exact states the GPU's are held to."""
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=1))

"""A kernel that fails gives way to its reference for the rest of the process, logged once."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.kernels import fallback


def test_a_failing_kernel_gives_way_to_its_reference_once(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def kernel(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        raise RuntimeError("out of resource: shared memory, Required: 300000\nmore detail")

    def reference(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.arange(3.0)
    with caplog.at_level(logging.WARNING, logger="retake.kernels"):
        for _ in range(3):
            assert torch.equal(fallback.guarded("test kernel", kernel, reference, x), x * 2)
    assert len(calls) == 1  # tried once, then the reference only
    assert fallback.failures()["test kernel"] == "RuntimeError: out of resource: shared memory, Required: 300000"
    assert [r.getMessage() for r in caplog.records].count(
        "the test kernel kernel failed on this GPU (RuntimeError: out of resource: shared memory, Required: "
        "300000): its torch reference runs from now on") == 1


def test_a_working_kernel_is_what_runs() -> None:
    x = torch.arange(3.0)
    assert torch.equal(fallback.guarded("working kernel", lambda t: t + 1, lambda t: t * 0, x), x + 1)
    assert "working kernel" not in fallback.failures()

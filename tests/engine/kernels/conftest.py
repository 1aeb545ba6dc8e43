"""Where the kernel tests (marker `kernel`) run: on a GPU in this process; without CUDA in
Triton's interpreter, in a child pytest process that test_interpreter.py starts.

TRITON_INTERPRET=1 must be set before triton is imported (Triton's own library, tl.sort
for one, is decorated then), and set process-wide it also changes how torch.compile runs
on CPU (moshi compiles its layers there, and the conversation tests then stall). So this
process never sets it: without CUDA it skips the kernel tests, and the child runs them
with the variable set from its start."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch


def kernels_run_here() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if kernels_run_here():
        return
    skip = pytest.mark.skip(reason="runs in Triton's interpreter in a child process (test_interpreter.py)")
    for item in items:
        if "kernel" in item.keywords:
            item.add_marker(skip)

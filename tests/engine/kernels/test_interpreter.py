"""Without a GPU, every kernel test (marker `kernel`) runs in Triton's interpreter, in a
child pytest process started with TRITON_INTERPRET=1 (see conftest.py for why not here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernel tests run on the GPU in this process")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="this is the interpreter's process already")
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (the dev extra installs it)")
def test_kernel_tests_pass_in_the_triton_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", str(Path(__file__).parent), "-m", "kernel and not gpu",
         "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    report = child.stdout[-6000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    assert " passed" in child.stdout and " skipped" not in child.stdout, report  # every kernel test ran

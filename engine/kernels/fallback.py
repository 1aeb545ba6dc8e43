"""A kernel that cannot build or run on this GPU gives way to its torch reference, said once.

    out = guarded("ring attention", ring_attention_kernel, ring_attention_reference, *args)

Design choices:
- Triton compiles a kernel at its first launch on the GPU it meets; a failure there (a
  compiler error, too many registers or shared memory for this GPU) raises before anything
  runs, so the reference takes over for the rest of the process: a slower tick rather than
  a dead engine. The reference has the kernel's signature and defines its result.
- Nothing is caught inside a CUDA graph capture: a failed launch spoils the capture, and
  engine/graphs.py then runs that bucket eagerly, where this guard acts. Graphs warm up
  eagerly before capturing, so a kernel that cannot build fails there first.
- The failure is logged once, by name (`failures()` lists them); the kernel tests call the
  kernels directly, so a kernel that fails there still fails its test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch

Result = TypeVar("Result")

log = logging.getLogger("retake.kernels")
_failed: dict[str, str] = {}


def guarded(name: str, kernel: Callable[..., Result], reference: Callable[..., Result], *args: object) -> Result:
    """kernel(*args), or reference(*args) once the kernel has failed in this process."""
    if name not in _failed:
        try:
            return kernel(*args)
        except Exception as error:  # any build or launch failure: the reference runs instead
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise
            _failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log.warning("the %s kernel failed on this GPU (%s): its torch reference runs from now on",
                        name, _failed[name])
    return reference(*args)


def failures() -> dict[str, str]:
    """Kernels that failed in this process, and why."""
    return dict(_failed)

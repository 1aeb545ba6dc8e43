"""Copies between the host and the GPU that never block another thread's kernel launches.

    host = to_host(tensor)                   # a CPU copy; on CUDA pinned, non-blocking, event polled
    host = to_host(tensor, out=pinned)       # into a pinned buffer the caller keeps
    device_tensor = to_device(array_or_tensor, device)   # pinned staging, non-blocking
    copy_to(device_buffer, host_tensor)                  # into a static buffer, the same way

Why: a plain device-to-host read (`.tolist()`, `.item()`, `.cpu()`, `int(tensor)`) of
pageable memory waits inside the driver in a way that also holds up every other thread's
`cudaLaunchKernel` (PyTorch issue 143825). The decode loop reads each step's status while
the vocoder worker thread launches a window's codec kernels: with `.tolist()` the window's
kernels could only launch between steps' waits, and the first window of a take arrived
after about the whole take had decoded (measured on the H200: docs/perf.md, "The first
window bug").

Design choices:
- On CUDA a read is a `non_blocking` copy into pinned memory, an event recorded after it
  on the current stream, and the event polled with `query()` (a short sleep between polls
  leaves the GIL and the driver free). `idle` runs between polls (at least once, on a CPU
  too): the decode loop hands out the windows the vocoder finished while it waits
  (slots.py `hand_ready`) instead of after the step. `torch.cuda.set_sync_debug_mode("error")` accepts
  all of it, which is how the GPU tests keep the hot paths honest.
- A pinned buffer kept by the caller (the decoder's status) is reused every step; other
  reads take one from torch's caching host allocator, which keeps a block from reuse until
  the copies that used it have finished.
- Host-to-device copies go through pinned memory with `non_blocking=True` too: a pageable
  one synchronises the stream first.
- On a CPU these are plain copies (or none), so one code path serves both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from numpy.typing import NDArray

POLL_S = 0.0002  # between event polls: far below a decode step (milliseconds), frees the GIL


def wait_for(event: torch.cuda.Event, idle: Callable[[], object] | None = None) -> None:
    """Return once the work before `event` has run, polling (no blocking driver call);
    `idle()` between polls, and once before the first."""
    while True:
        if idle is not None:
            idle()
        if event.query():
            return
        time.sleep(POLL_S)


def pinned_like(tensor: torch.Tensor) -> torch.Tensor:
    """A host buffer shaped like `tensor`: pinned when it lives on CUDA."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)


def to_host(tensor: torch.Tensor, out: torch.Tensor | None = None,
            idle: Callable[[], object] | None = None) -> torch.Tensor:
    """`tensor` on the host, read without blocking other threads' launches (see above).
    `out` (pinned, same shape and dtype) is filled and returned when given; `idle` as `wait_for`'s."""
    if not tensor.is_cuda:
        if idle is not None:
            idle()
        return tensor if out is None else out.copy_(tensor)
    out = pinned_like(tensor) if out is None else out
    out.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    wait_for(event, idle)
    return out


def to_device(data: torch.Tensor | NDArray[np.generic], device: torch.device) -> torch.Tensor:
    """Host data on `device`; to CUDA through pinned memory, without a stream sync."""
    tensor = torch.from_numpy(data) if isinstance(data, np.ndarray) else data
    if device.type != "cuda" or tensor.is_cuda:
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def copy_to(target: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """Host `data` into the (static) device tensor `target` of its shape, without a stream sync."""
    if not target.is_cuda:
        return target.copy_(data)
    return target.copy_(data.pin_memory(), non_blocking=True)

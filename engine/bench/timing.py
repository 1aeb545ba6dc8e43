"""What the benchmarks time with: CUDA events on a GPU, the host clock on a CPU, and the
device's copy bandwidth (the floor a memory-bound step is compared with).

Design choices:
- One timer per call (`timed_ms`), so a bench reports the median and the spread it likes;
  events are synchronised after each call, so nothing queued is timed twice.
- The bandwidth is that of one large device-to-device copy (read and write counted), measured
  here rather than taken from a datasheet: what this GPU moves, not what it is rated for.
- A profile's table (`kernel_table`) opens with how many kernels ran and their time: a step
  bound by its launches shows it in the count before any row of the table.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Milliseconds of each call, CUDA events on the GPU, the host clock on the CPU."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
    return times


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    src, dst = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    src.random_(0, 255)
    ms = statistics.median(timed_ms(lambda: dst.copy_(src), device, 20))
    return 2 * n / (ms / 1000)


def kernel_table(profile: Any, title: str, device: torch.device, rows: int = 30) -> str:
    """A torch.profiler run as `# title: N kernels, X ms of kernel time` (what a step launched
    and how long its kernels ran; N is what a launch-bound step pays for) and its table, most
    time first. On a CPU, the ops' table under the title."""
    events = profile.key_averages()
    cuda = device.type == "cuda"
    head = f"# {title}: CPU ops (no GPU here)"
    if cuda:
        kernels = [e for e in events if e.device_type.name == "CUDA"]
        ms = sum(getattr(e, "self_device_time_total", 0.0) for e in kernels) / 1000
        head = f"# {title}: {sum(e.count for e in kernels)} kernels, {ms:.2f} ms of kernel time"
    table: str = events.table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=rows)
    return head + "\n" + table



def parts_line(profile: Any, device: torch.device, parts: tuple[str, ...], whole: str) -> str:
    """`# parts (ms of kernel time): a X, b Y, other Z`: a profile's time by the profiler ranges
    named `parts`, and the rest of the range `whole` around all of it (on a GPU the kernels'
    time, on a CPU the host's), so which part of a step to work on is one line."""
    cuda = device.type == "cuda"

    def ms(event: Any) -> float:
        return float(getattr(event, "device_time_total" if cuda else "cpu_time_total", 0.0)) / 1000

    events = profile.key_averages()
    # A range is listed twice on a GPU: on the host (its device time: the kernels it launched) and
    # on the GPU's timeline (its span there, idle gaps included: an eager part's launch time).
    found = {event.key: ms(event) for event in events
             if event.key in (*parts, whole) and event.device_type.name == "CPU"}
    total = found.pop(whole, 0.0)
    if cuda:
        total = sum(float(getattr(e, "self_device_time_total", 0.0)) for e in events
                    if e.device_type.name == "CUDA") / 1000
    named = ", ".join(f"{part} {found.get(part, 0.0):.2f}" for part in parts)
    return (f"# parts (ms of {'kernel' if cuda else 'CPU'} time): {named}, "
            f"other {max(total - sum(found.values()), 0.0):.2f}")


def ranged(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` inside a profiler range `name` (a bench wraps a part of a step with it while it profiles)."""
    from torch.profiler import record_function

    def call(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return call

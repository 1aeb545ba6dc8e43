"""CUDA-graph capture and replay of a step function, one graph per bucket.

A step is a function of one integer bucket (for decode: the KV length the attention
reads) that reads and writes only static, preallocated tensors. `StepGraphs` runs it
eagerly a few times on a side stream (so lazy initialisation and autotuning happen
outside the capture), captures it per bucket into graphs that share one memory pool,
and afterwards replays the graph of the smallest bucket that fits.

Design choices (nano-vllm's capture_cudagraph, moshi's CUDAGraphed):
- The model never knows about graphs; the caller owns the static buffers.
- Disabled (plain eager calls, same results) on CPU or when asked, so one code path
  serves tests and the GPU.
- Buckets are captured largest first so the shared pool is sized once. Several
  StepGraphs may share a pool (`shared_pool()`) when their graphs never run at once.
- Warm-up and capture run the step, so they change the static buffers it writes:
  capture before a take starts, then reset those buffers.
- Each capture gets a cuBLAS workspace of its own, in its graph's pool: cuBLAS keeps one
  workspace per (thread's handle, stream), every `torch.cuda.graph` captures on one class-wide
  stream, so without clearing the workspaces first every graph captured on a thread bakes in
  the same workspace. Graphs replayed at once on two streams (the vocoder's codec windows on
  its side stream, the decode step and prefill chunks on the engine's) then write each
  other's split-K partial sums and stream-K semaphores: on the H200 that gave prefill chunks
  non-finite from a middle layer on, and a GPU that hung with 16 directors (2026-12-04,
  docs/perf.md). Inductor's CUDA graph trees clear them before each capture for the same reason.
- A bucket that cannot be captured runs eagerly, with the reason logged (never a crash):
  the last warm-up call runs under CUDA's sync debug mode "error" (the first may compile
  and autotune, which synchronise), so a step that reads the host (which a capture cannot
  hold) is found before the capture; a capture that fails anyway is caught the same way.
- `time_replays` measures each captured graph (CUDA events, the median of a few replays),
  for callers whose larger bucket may be the faster one (the codec's window graphs: cuDNN
  picks its convolutions by length, and on an H100 a 32-frame window's graph replayed in
  9.7 ms where the 64-frame one took 7.6); `fastest_for` routes by those times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # the type of a graph's memory pool (torch keeps it private)

log = logging.getLogger("retake.engine")


def clear_cublas_workspaces() -> None:
    """Forget cuBLAS's workspaces, so the next use, a capture, allocates a new one. A workspace
    a graph baked in goes back to the pool it came from, which only that pool's graphs use."""
    torch._C._cuda_clearCublasWorkspaces()  # private: what inductor's graph trees call


def shared_pool() -> _POOL_HANDLE:
    """A memory pool for graphs that never replay at the same time."""
    return torch.cuda.graph_pool_handle()


class StepGraphs:
    def __init__(self, step: Callable[[int], object], buckets: Iterable[int], *, enabled: bool,
                 warmup_calls: int = 2, generators: Iterable[torch.Generator] = (),
                 pool: _POOL_HANDLE | None = None, name: str = "step") -> None:
        self.step, self.name = step, name
        self.generators = tuple(generators)  # non-default generators the step draws from
        self.buckets = sorted(set(buckets))
        self.enabled = enabled and torch.cuda.is_available()
        self.warmup_calls = warmup_calls
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager: dict[int, str] = {}  # buckets that could not be captured, and why
        self.pool: _POOL_HANDLE | None = pool  # the memory pool the graphs share, once one exists
        self.capture_s: dict[int, float] = {}
        self.replay_ms: dict[int, float] = {}  # captured buckets' replay times, once `time_replays` ran

    def bucket_for(self, length: int) -> int:
        for bucket in self.buckets:
            if bucket >= length:
                return bucket
        raise ValueError(f"length {length} exceeds the largest bucket {self.buckets[-1]}")

    def fastest_for(self, length: int) -> int:
        """The bucket that fits `length` whose graph replayed fastest (`time_replays`); the smallest
        that fits where none of them is timed."""
        smallest = self.bucket_for(length)
        timed = [(ms, bucket) for bucket, ms in self.replay_ms.items() if bucket >= length]
        return min(timed)[1] if timed else smallest

    def time_replays(self, repeats: int = 5) -> dict[int, float]:
        """Each captured graph's replay in ms (the median of `repeats`, after one unmeasured):
        what `fastest_for` routes by. The replays write the step's static buffers, as a capture does."""
        for bucket, graph in sorted(self.graphs.items()):
            graph.replay()
            times = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            self.replay_ms[bucket] = sorted(times)[len(times) // 2]
        return self.replay_ms

    @property
    def captured(self) -> bool:
        """Every bucket has its graph or runs eagerly for a logged reason (or graphs are off)."""
        return not self.enabled or len(self.graphs) + len(self.eager) == len(self.buckets)

    def capture(self, buckets: Iterable[int] | None = None) -> None:
        """Capture the given buckets (default: all), largest first."""
        if not self.enabled:
            return
        for bucket in sorted(buckets or self.buckets, reverse=True):
            if bucket in self.graphs or bucket in self.eager:
                continue
            started = time.perf_counter()
            try:
                self.graphs[bucket] = self.capture_one(bucket)
            except Exception as error:  # noqa: BLE001 - it reads the host, or the capture failed: run it eagerly
                torch.cuda.synchronize()
                self.eager[bucket] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                log.warning("%s: bucket %d runs eagerly (no CUDA graph): %s", self.name, bucket, self.eager[bucket])
                continue
            self.capture_s[bucket] = time.perf_counter() - started

    def capture_one(self, bucket: int) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for call in range(self.warmup_calls):
                # The first call may compile and autotune (they synchronise); a later one must not read the host.
                checked = 0 < call == self.warmup_calls - 1
                torch.cuda.set_sync_debug_mode("error" if checked else "default")
                try:
                    self.step(bucket)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:  # replays then advance the generator's own offset
            graph.register_generator_state(generator)
        clear_cublas_workspaces()  # the capture allocates its own, in this graph's pool (see above)
        with torch.cuda.graph(graph, pool=self.pool):
            self.step(bucket)
        if self.pool is None:
            self.pool = graph.pool()
        torch.cuda.synchronize()
        return graph

    def __call__(self, length: int) -> None:
        """Run the step for a KV length: replay its bucket's graph, or call it eagerly."""
        bucket = self.bucket_for(length)
        graph = self.graphs.get(bucket) if self.enabled else None
        if graph is None:
            self.step(bucket)
        else:
            graph.replay()

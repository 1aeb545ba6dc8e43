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
- Buckets are captured largest first so the shared pool is sized once.
- Warm-up and capture run the step, so they change the static buffers it writes:
  capture before a take starts, then reset those buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # the type of a graph's memory pool (torch keeps it private)


class StepGraphs:
    def __init__(self, step: Callable[[int], object], buckets: Iterable[int], *, enabled: bool,
                 warmup_calls: int = 2, generators: Iterable[torch.Generator] = ()) -> None:
        self.step = step
        self.generators = tuple(generators)  # non-default generators the step draws from
        self.buckets = sorted(set(buckets))
        self.enabled = enabled and torch.cuda.is_available()
        self.warmup_calls = warmup_calls
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool: _POOL_HANDLE | None = None  # the memory pool the graphs share, once one exists
        self.capture_s: dict[int, float] = {}

    def bucket_for(self, length: int) -> int:
        for bucket in self.buckets:
            if bucket >= length:
                return bucket
        raise ValueError(f"length {length} exceeds the largest bucket {self.buckets[-1]}")

    def capture(self, buckets: Iterable[int] | None = None) -> None:
        """Capture the given buckets (default: all), largest first."""
        if not self.enabled:
            return
        for bucket in sorted(buckets or self.buckets, reverse=True):
            if bucket in self.graphs:
                continue
            started = time.perf_counter()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(self.warmup_calls):
                    self.step(bucket)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            for generator in self.generators:  # replays then advance the generator's own offset
                graph.register_generator_state(generator)
            with torch.cuda.graph(graph, pool=self.pool):
                self.step(bucket)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bucket] = graph
            torch.cuda.synchronize()
            self.capture_s[bucket] = time.perf_counter() - started

    def __call__(self, length: int) -> None:
        """Run the step for a KV length: replay its bucket's graph, or call it eagerly."""
        bucket = self.bucket_for(length)
        graph = self.graphs.get(bucket) if self.enabled else None
        if graph is None:
            self.step(bucket)
        else:
            graph.replay()

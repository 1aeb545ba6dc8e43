"""The GPU fast path of Drama 3: kernels installed into a built model, and a graphed decode step.

    decoder = GraphedDecoder(model, max_rows)    # a Decoder whose step replays CUDA graphs
    decoder.capture(max_rows)                    # before the first take (warm-up)
    take(decoder, codec, prompt, ..., step=decoder.replay)

Design choices:
- Serving concerns are transformations of an already-built model (gpt-fast's
  `apply_tp`, `replace_linear_int8`): the model files know nothing of kernels or graphs,
  and the eager path stays available and identical (tests compare the two).
- One CUDA graph per KV bucket (the attended cache rows: 256, 512, 1024, ... up to the
  cache size). A step at position p replays the smallest bucket >= p + 2. Every bucket
  is captured at warm-up, before the first take: capturing runs the step, which would
  scramble a take in flight.
- The take's random stream must be the one the graph captured: the Decoder keeps one
  generator for its lifetime and re-seeds it in place per take; it is registered with
  every graph (a take with a seed stays reproducible, and graph == eager draw for draw).
"""

from __future__ import annotations

import torch

from engine.drama3.generate import KV_BUCKET_ROWS, Decoder
from engine.drama3.model import Drama3Model
from engine.graphs import StepGraphs


class GraphedDecoder(Decoder):
    """A Decoder whose step is replayed from CUDA graphs (plain eager steps on CPU)."""

    def __init__(self, model: Drama3Model, max_rows: int, slot: int = 0, *, enabled: bool = True) -> None:
        super().__init__(model, max_rows, slot)
        buckets = [KV_BUCKET_ROWS << i for i in range(16) if KV_BUCKET_ROWS << i < max_rows] + [max_rows]
        self.graphs = StepGraphs(self.step, buckets,
                                 enabled=enabled and self.device.type == "cuda", generators=[self.generator])

    def capture(self, up_to_rows: int | None = None) -> None:
        """Capture the buckets up to `up_to_rows` (default: all). Scrambles the decode state:
        call before a take's prefill."""
        limit = up_to_rows or self.max_rows
        self.position.zero_()
        self.graphs.capture([b for b in self.graphs.buckets if b <= self.graphs.bucket_for(limit)])

    def replay(self, position: int) -> None:
        """One step at `position` (the input frame's): replay its bucket's graph."""
        bucket = self.graphs.bucket_for(position + 2)
        if bucket not in self.graphs.graphs and self.graphs.enabled:
            raise RuntimeError(f"no graph captured for {bucket} cache rows; capture it before the take")
        self.graphs(position + 2)

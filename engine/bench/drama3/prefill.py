"""Drama 3 prefill timed: each prompt size launched from Python and replayed from the chunk graphs.

Design choices:
- Both decoders prefill the same synthetic prompt; the median of 3 after a warm-up (which
  also autotunes and fills the allocator), so the first call's one-off costs are not timed.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import TYPE_CHECKING

import torch

from engine.bench.drama3.model import Row, synthetic_prompt
from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.config import Drama3Config
    from engine.drama3.model import Drama3Model

PREFILL_ROWS = (300, 1000, 4000)
PREFILL_TARGETS_MS = {300: 30.0, 1000: 80.0, 4000: 300.0}


def bench_prefill(model: Drama3Model, config: Drama3Config, device: torch.device,
                  sizes: list[int] = list(PREFILL_ROWS)) -> list[Row]:  # noqa: B006 - never mutated
    """Each prompt size prefilled launched from Python (chunks of 512 rows) and, on CUDA,
    replayed from the chunk graphs (prefill.py); median of 3 after a warm-up."""
    from engine.drama3.decoder import Decoder

    rows_out = []
    max_rows = max(sizes) + 64
    eager = Decoder(model, max_rows)
    graphed = Decoder(model, max_rows, graphs=True)
    started = time.perf_counter()
    graphed.chunked.capture()
    capture_s = round(time.perf_counter() - started, 1)
    eager_sizes = sorted(size for size, graphs in graphed.chunked.graphs.items() if graphs.eager)
    for rows in sizes:
        prompt = synthetic_prompt(config, rows, 16)
        row: Row = {"bench": "prefill", "rows": rows}
        for name, decoder in (("eager", eager), ("graph", graphed)):
            decoder.prefill(prompt)  # warm-up (autotuning, allocator)
            ms = statistics.median(timed_ms(functools.partial(decoder.prefill, prompt), device, 3))
            row[f"{name}_ms"], row[f"{name}_rows_per_s"] = round(ms, 2), round(rows / ms * 1000)
        row.update(target_ms=PREFILL_TARGETS_MS.get(rows), graphs=graphed.graphed, capture_s=capture_s,
                   eager_chunk_sizes=eager_sizes)
        rows_out.append(row)
    return rows_out

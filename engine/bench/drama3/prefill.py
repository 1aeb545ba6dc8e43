"""Drama 3 prefill timed: each prompt size launched from Python and replayed from the chunk graphs;
prompts waiting together prefilled one by one and in groups.

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
    from engine.drama3.prompt import Prompt

PREFILL_ROWS = (300, 1000, 4000)
PREFILL_TARGETS_MS = {300: 30.0, 1000: 80.0, 4000: 300.0}
GROUP_PROMPT_ROWS = (40, 100, 255)  # a line's own rows after a restored prefix; a short first prompt; a second
# take's kept take and line (longer than every group shape: cut to join, prefill_groups.py `cut`)
GROUP_PROMPTS = (2, 4, 8)


def bench_prefill(model: Drama3Model, config: Drama3Config, device: torch.device,
                  sizes: list[int] = list(PREFILL_ROWS)) -> list[Row]:  # noqa: B006 - never mutated
    """Each prompt size prefilled launched from Python (chunks of 512 rows) and, on CUDA,
    replayed from the chunk graphs (prefill.py); median of 3 after a warm-up."""
    from engine.drama3.decoder import Decoder

    rows_out = []
    max_rows = max(sizes) + 64
    eager = Decoder(model, max_rows)
    graphed = Decoder(model, max_rows, graphs=True, mixed=False)  # (no take decodes beside it)
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


def bench_prefill_groups(model: Drama3Model, config: Drama3Config, device: torch.device) -> list[Row]:
    """Prompts waiting together (as when directors start at once) prefilled one after another
    and as groups (prefill_groups.py): graphs on CUDA, groups asked for on a CPU too. Median
    of 3 after a warm-up; each prompt in its own slot."""
    from engine.drama3.decoder import Decoder
    from engine.drama3.prefill_groups import PREFILL_GROUP

    decoder = Decoder(model, max(GROUP_PROMPT_ROWS) + 64, slots=max(GROUP_PROMPTS), graphs=True, group=PREFILL_GROUP)
    started = time.perf_counter()
    decoder.chunked.capture(decoder.scratch)
    decoder.groups.capture()
    capture_s = round(time.perf_counter() - started, 1)

    def alone(prompts: list[Prompt]) -> None:
        for slot, prompt in enumerate(prompts):
            decoder.prefill(prompt, slot)

    def grouped(prompts: list[Prompt]) -> None:
        decoder.prefill_together([decoder.begin_prefill(prompt, slot) for slot, prompt in enumerate(prompts)])

    out: list[Row] = []
    for rows in GROUP_PROMPT_ROWS:
        for count in GROUP_PROMPTS:
            prompts = [synthetic_prompt(config, rows, 16, seed) for seed in range(count)]
            row: Row = {"bench": "prefill_group", "rows": rows, "prompts": count}
            for name, run in (("alone", alone), ("grouped", grouped)):
                run(prompts)  # warm-up
                row[f"{name}_ms"] = round(statistics.median(timed_ms(functools.partial(run, prompts), device, 3)), 2)
            row.update(ratio=round(row["alone_ms"] / row["grouped_ms"], 2), graphs=decoder.graphed,
                       capture_s=capture_s)
            out.append(row)
    return out

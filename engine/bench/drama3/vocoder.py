"""The vocoder's batched windows: codec time per window when 1, 4 or 16 takes' long windows
(64 new frames after 320 of context: every window of a take after its first ~4 seconds)
decode in one call, replayed from the window graphs of that many rows, and launched from
Python; and a take's first windows (1, 2, 4, 10, ... frames) alone and 8 to a call
(`retake serve --vocoder-batch 8 --vocoder-batch-from 1`).

Design choices:
- Each batch size gets window graphs of its own (the 384-frame length, with the 320-frame
  one below it so that the long windows' convolutions run on their 64 new frames and 10 of
  context, as in the engine; stop 35's rows ran them on all 384: 51.5 ms a window), captured,
  timed and freed before the next, so one run measures the rows the engine could be
  given (`EngineSpec.vocoder_batch`) without holding every pool at once.
- A take's first windows are short and launch-bound (a 10-frame window's graph took 4.25 ms
  on the H200, a 64+320-frame one 13.2): at 64 directors they are most of the vocoder's calls,
  so what 8 of them cost in one call against one alone says whether first windows should batch.
- The budget is what 64 takes playing in real time leave each window: a take sends a
  long window every 64 frames, so 64 takes send one per frame's duration (46.4 ms).
"""

from __future__ import annotations

import functools
import gc
import statistics
from typing import TYPE_CHECKING

import torch

from engine.bench.drama3.model import Row
from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec

BATCHES = (1, 4, 16)
SHORT_BATCHES = (1, 8)
TAKES = 64  # takes playing at once, for the budget


def bench_vocoder_batch(codec: Codec, device: torch.device, batches: tuple[int, ...] = BATCHES,
                        repeats: int = 5) -> list[Row]:
    """Per batch size: ms per call and per window of the long windows decoded together, from
    graphs and eagerly, beside the real-time budget per window at 64 takes."""
    from engine.drama3.codec_graphs import WindowGraphs, decode_windows
    from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE, STREAM_OVERLAP_FRAMES, Window

    new, context = STREAM_FOLLOWUP_STRIDE, STREAM_OVERLAP_FRAMES
    length = new + context
    window = Window(start=0, emit=context, end=length, last=False)
    frame_ms = codec.frame_samples / codec.sample_rate * 1000
    budget = round(frame_ms * new / TAKES, 1)  # ms of codec time per window at TAKES takes in real time
    generator = torch.Generator().manual_seed(0)
    out: list[Row] = []
    for batch in batches:
        windows = [(torch.stack([torch.randint(0, n, (length,), generator=generator) for n in codec.codebook_sizes])
                    .to(device), window) for _ in range(batch)]  # [num_codebooks, length] each: one take's frames
        row: Row = {"bench": "vocode_batch", "frames": new, "context_frames": context, "batch": batch}
        eager = functools.partial(codec.decode_batch, torch.stack([codes for codes, _ in windows]))  # [B, N, L]
        eager()
        eager_ms = statistics.median(timed_ms(eager, device, repeats))
        row.update(eager_call_ms=round(eager_ms, 2), eager_window_ms=round(eager_ms / batch, 2))
        # the context's length too: its graph makes the long one's convolutions run on the new frames
        # and their context alone (WindowGraphs.kept), as the engine's graphs do; alone, a length runs all
        graphs = WindowGraphs(codec, [context, length], batch=batch, batched_from=length)
        graphs.capture()
        if graphs.runs(window):  # (on a CPU graphs are off: eager only)
            call = functools.partial(decode_windows, codec, windows, graphs)
            call()
            graph_ms = statistics.median(timed_ms(call, device, repeats))
            row.update(graph_call_ms=round(graph_ms, 2), graph_window_ms=round(graph_ms / batch, 2))
        row["budget_window_ms"] = budget
        out.append(row)
        del graphs, windows
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def bench_first_windows(codec: Codec, device: torch.device, batches: tuple[int, ...] = SHORT_BATCHES,
                        repeats: int = 5) -> list[Row]:
    """A take's windows shorter than the long ones (first window 1, 320 frames of context), each
    length from its graph with `batch` rows (every window batched): ms per call and per window."""
    from engine.drama3.codec_graphs import BATCHED_FROM, WindowGraphs, decode_windows
    from engine.drama3.stream import STREAM_OVERLAP_FRAMES, Window, take_windows, window_lengths

    lengths = [n for n in window_lengths(STREAM_OVERLAP_FRAMES, 1) if n < BATCHED_FROM]
    generator = torch.Generator().manual_seed(1)
    takes = [torch.stack([torch.randint(0, n, (BATCHED_FROM,), generator=generator) for n in codec.codebook_sizes])
             .to(device) for _ in range(max(batches))]  # [num_codebooks, frames] each
    out: list[Row] = []
    for batch in batches:
        graphs = WindowGraphs(codec, lengths, batch=batch, batched_from=1)
        graphs.capture()
        firsts: dict[int, Window] = {}  # graph length -> the take's first window of it
        for window in take_windows(lengths[-1], STREAM_OVERLAP_FRAMES, 1):
            if window.frames and (length := graphs.length_for(window)) is not None:
                firsts.setdefault(length, window)
        for length, window in firsts.items():
            call = functools.partial(decode_windows, codec, [(codes, window) for codes in takes[:batch]], graphs)
            call()
            ms = statistics.median(timed_ms(call, device, repeats))
            out.append({"bench": "vocode_first_windows", "length": length, "frames": window.frames, "batch": batch,
                        "graph": graphs.runs(window), "call_ms": round(ms, 2), "window_ms": round(ms / batch, 2)})
        del graphs
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out

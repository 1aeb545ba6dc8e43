"""The vocoder's batched windows: codec time per window when 1, 4 or 16 takes' long windows
(64 new frames after the take's codec state: every window of a take after its first ~3
seconds) decode in one call, replayed from the window graph of that many rows, and launched
from Python; and the same for short windows (2 and 10 new frames), 1 or 8 to a call.

Why the short ones: on an H100 a window costs 3.6-7.7 ms whatever its frames (stop 46), so at
32 to 64 directors the vocoder was the queue, and a short window's call is bound by its
kernels' count, not its frames: if 8 short windows in one call cost about one, the engine's
short windows should share calls (`--vocoder-batch-from`, which batches every window from its
frames up, long ones too: these rows say what each size gains).

Design choices:
- Each batch size gets a window graph of its own, captured, timed and freed before the
  next, so one run measures the rows the engine could be given (`EngineSpec.vocoder_batch`)
  without holding every pool at once.
- Every call starts its takes from the same codec state (a take's after 320 frames), copied
  in as the engine copies a take's: a window decodes once per state.
- The budget is what 64 takes playing in real time leave each window: a take sends a
  long window every 64 frames, so 64 takes send one per frame's duration (46.4 ms).
- (Stop 37's rows of a take's first windows 8 to a call are gone: on an H100 batching them
  made 64 directors' audio 21 seconds a second against 37, docs/perf.md.)
"""

from __future__ import annotations

import functools
import gc
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.bench.drama3.model import Row
from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec
    from engine.drama3.codec_stream import CodecState, StreamState

BATCHES = (1, 4, 16)  # long windows' rows
SHORT_WINDOWS = (2, 10)  # new frames of the short windows timed
SHORT_BATCHES = (1, 8)  # their rows
TAKES = 64  # takes playing at once, for the budget


def streams_at(codec: Codec, codes: torch.Tensor, frames: int) -> Callable[[], StreamState]:
    """A maker of takes' codec states after their first `frames` frames of `codes` [N, >= frames]
    (each a copy: a window decodes once per state)."""
    from engine.drama3.codec_stream import StreamState, new_state, window_pcm
    from engine.drama3.stream import Window

    before = StreamState()
    with torch.inference_mode():
        window_pcm(codec, codes, Window(0, frames), before)

    def make() -> StreamState:
        stream = StreamState()
        if frames:
            stream.codec, stream.frames = new_state(codec, 1), frames
            stream.codec.copy_(before.state(codec))
        return stream
    return make


def bench_vocoder_batch(codec: Codec, device: torch.device, batches: tuple[int, ...] = BATCHES,
                        repeats: int = 5) -> list[Row]:
    """Per window size and batch size: ms per call and per window of the windows decoded
    together, from graphs and eagerly, beside the real-time budget per window at 64 takes
    (each sending windows of that size back to back)."""
    from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE

    context = 320
    sizes = [(STREAM_FOLLOWUP_STRIDE, batches), *((new, SHORT_BATCHES) for new in SHORT_WINDOWS)]
    frame_ms = codec.frame_samples / codec.sample_rate * 1000
    generator = torch.Generator().manual_seed(0)
    longest = context + max(new for new, _ in sizes)
    takes = [torch.stack([torch.randint(0, n, (longest,), generator=generator) for n in codec.codebook_sizes])
             .to(device) for _ in range(max(batches + SHORT_BATCHES))]  # [num_codebooks, longest]: a take's frames
    stream = streams_at(codec, takes[0], context)  # every take from this state: the times do not depend on it
    base = stream().state(codec)
    return [row for new, rows in sizes for row in bench_windows(codec, device, takes, new, context, rows, repeats,
                                                               stream, base, round(frame_ms * new / TAKES, 1))]


def bench_windows(codec: Codec, device: torch.device, takes: list[torch.Tensor], new: int, context: int,
                  batches: tuple[int, ...], repeats: int, stream: Callable[[], StreamState], base: CodecState,
                  budget: float) -> list[Row]:
    """bench_vocoder_batch's rows for windows of `new` frames after `context`, `budget` ms each."""
    from engine.drama3.codec_graphs import WindowGraphs, decode_windows
    from engine.drama3.codec_stream import decode_next, new_state
    from engine.drama3.stream import Window

    window = Window(emit=context, end=context + new, last=False)
    out: list[Row] = []
    for batch in batches:
        row: Row = {"bench": "vocode_batch", "frames": new, "context_frames": context, "batch": batch}
        state, count = new_state(codec, batch), torch.full((batch,), new, device=device)
        for take in range(batch):
            state.copy_(base, into=take, row=0)
        codes = torch.stack([take[:, context:context + new] for take in takes[:batch]])  # [B, N, new]
        eager = functools.partial(torch.inference_mode()(decode_next), codec, codes, state, count, codec.conv_context)
        eager()
        eager_ms = statistics.median(timed_ms(eager, device, repeats))
        row.update(eager_call_ms=round(eager_ms, 2), eager_window_ms=round(eager_ms / batch, 2))
        graphs = WindowGraphs(codec, [1], [new], batch=batch, batched_from=new)
        graphs.capture()
        if graphs.runs(window):  # (on a CPU graphs are off: eager only)
            def call(batch: int = batch, graphs: WindowGraphs = graphs) -> None:
                with torch.inference_mode():
                    decode_windows(codec, [(codes, window, stream()) for codes in takes[:batch]], graphs)
            call()
            graph_ms = statistics.median(timed_ms(call, device, repeats))
            row.update(graph_call_ms=round(graph_ms, 2), graph_window_ms=round(graph_ms / batch, 2))
        row["budget_window_ms"] = budget
        out.append(row)
        del graphs, state
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out

"""A Drama 3 take's first audio (prefill start to the first PCM window on the host), and vocode
time per window length, launched from Python and replayed from the window graphs.

Design choices:
- First audio runs takes as the engine does (`Slots`), its windows vocoded inline and on a
  worker thread, with the default and a smaller first window; the first take of each is a
  warm-up and is left out of the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.bench.drama3.model import Row, synthetic_prompt
from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec
    from engine.drama3.codec_stream import StreamState
    from engine.drama3.config import Drama3Config
    from engine.drama3.model import Drama3Model

WINDOW_FRAMES = (1, 10, 20, 32, 64)  # 1: the server's first window


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


def bench_takes(model: Drama3Model, codec: Codec, config: Drama3Config, device: torch.device,
                prompt_rows: int = 300) -> list[Row]:
    """First audio of a take (its windows vocoded inline, and on a worker thread as the
    engine and the server do), and vocode time per window launched from Python and
    replayed from the window graphs (codec_graphs.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.drama3.codec_graphs import WindowGraphs, decode_window
    from engine.drama3.decoder import Decoder
    from engine.drama3.engine import FIRST_WINDOW_FRAMES
    from engine.drama3.slots import Slots
    from engine.drama3.stream import Window, first_frames, window_frames
    from engine.drama3.take import Done

    out: list[Row] = []
    max_rows = prompt_rows + 200 + 64
    decoder = Decoder(model, max_rows, graphs=True, mixed=False)  # one take at a time
    decoder.capture()
    settings = (FIRST_WINDOW_FRAMES, 4, None)  # the server's default, then 4, then the seed's 10
    graphs = WindowGraphs(codec, [first_frames(f) for f in settings], [n for f in settings for n in window_frames(f)])
    graphs.capture()
    window_graphs = graphs if graphs.graphs.enabled else None
    vocoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-vocoder")
    for first_window in settings:
        for where, executor in (("inline", None), ("thread", vocoder)):
            firsts: list[float] = []
            slots = Slots(decoder, codec, first_window=first_window,
                          executor=executor, graphs=window_graphs)
            for seed in range(4):
                prompt = synthetic_prompt(config, prompt_rows, 48, seed)
                done = next(e for e in slots.generate(slots.start(prompt)) if isinstance(e, Done))
                firsts.append(done.timings["first_audio_ms"] or 0.0)
            out.append({"bench": "first_audio", "prompt_rows": prompt_rows, "first_window_frames": first_window or 10,
                        "vocoder": where, "first_audio_ms": round(statistics.median(firsts[1:]), 1)})
    vocoder.shutdown()
    codes = torch.randint(0, 1024, (config.num_codebooks, 512), device=device)
    for context in (0, 320):  # a take's first window, and one after 320 frames
        stream = streams_at(codec, codes, context)
        for frames in WINDOW_FRAMES:
            window = Window(emit=context, end=context + frames, last=False)
            row: Row = {"bench": "vocode", "frames": frames, "context_frames": context}
            for name, by in (("eager_ms", None), ("graph_ms", graphs)):
                if by is None or by.runs(window):  # (each call from a fresh copy of the state)
                    def call(window: Window = window, by: WindowGraphs | None = by,
                             stream: Callable[[], StreamState] = stream) -> None:
                        decode_window(codec, codes, window, stream(), by)
                    call()
                    row[name] = round(statistics.median(timed_ms(call, device, 5)), 2)
            if graphs.runs(window):
                row["graph_frames"] = (graphs.graphs if context else graphs.firsts).fastest_for(frames)  # padded up
            out.append(row)
    return out

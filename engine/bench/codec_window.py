"""`retake bench codec --window`: a long window's graph with the decoder's Snakes in one pass and op by op.

A long window (64 new frames after a take's first 320, through the take's codec state:
every window of a take after its first seconds) decodes from its graph with the Snakes as
`ready` leaves them (one Triton pass each on a GPU: engine/kernels/snake.py) and launched op
by op (the layer's own arithmetic), and on a GPU once more with the quantiser's post
transformer compiled by Inductor (an experiment: its ~45 kernels a layer, norms, rope and
scales in float32 around four GEMMs, are most of a short window's launches; the engine does
not compile it), each with the largest PCM16 difference from the first; `--profile FILE`
adds the kernels of that window launched without its graph.

Design choices:
- The window graph is the one the engine captures for 64 frames (one row), built afresh per
  form: a graph holds the kernels of its capture. Each call starts from the same state (the
  take's after 320 frames), copied in as a take's is.
- On a CPU no Snake is fused: both rows run the same code (the graphs are off too), and the
  compiled row is left out (Inductor's CPU build takes minutes on 2 cores).
- The compiled module takes any window length (`dynamic=True`): one compile serves every
  graph length, as the engine would need.
- Kept from stop 37's forms bench, which also timed every convolution folded and as a matrix
  product (dropped: cuDNN's were as fast or faster, docs/perf.md).
"""

from __future__ import annotations

import functools
import gc
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec

Row = dict[str, Any]


def bench_window(codec: Codec, device: torch.device, repeats: int = 10, profile: Path | None = None) -> list[Row]:
    """A long window's graph with the Snakes fused (as `ready` leaves them) and launched op by op."""
    import numpy as np

    from engine.drama3.codec_graphs import WindowGraphs
    from engine.drama3.codec_layers import Snake
    from engine.drama3.codec_stream import StreamState, new_state, window_pcm
    from engine.drama3.codec_transformer import WindowLimitedTransformer
    from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE, Window

    new, context = STREAM_FOLLOWUP_STRIDE, 320
    window = Window(emit=context, end=context + new, last=False)
    generator = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randint(0, n, (context + new,), generator=generator)
                         for n in codec.codebook_sizes]).to(device)  # [num_codebooks, frames]
    before = StreamState()
    with torch.inference_mode():
        window_pcm(codec, codes, Window(0, context), before)  # the take's first 320 frames

    def call(graphs: WindowGraphs) -> np.ndarray:  # the window, from the state after those frames
        stream = StreamState()
        stream.codec, stream.frames = new_state(codec, 1), context
        stream.codec.copy_(before.state(codec))
        return graphs.pcm_batch([(codes, window, stream)])[0]

    snakes = [m for m in codec.decoder.modules() if isinstance(m, Snake)]
    inverses = [m.inverse for m in snakes]  # (None on a CPU: nothing fused)
    rows: list[Row] = []
    first: np.ndarray | None = None
    quantizer, transformer = codec.quantizer, codec.quantizer.post_module
    forms = [("fused", True, "eager"), ("op by op", False, "eager")]
    forms += [("fused", True, "compiled")] if device.type == "cuda" else []
    try:
        for name, keep, post in forms:
            for m, inverse in zip(snakes, inverses):
                m.inverse = inverse if keep else None
            quantizer.post_module = cast(WindowLimitedTransformer, torch.compile(transformer, dynamic=True)) \
                if post == "compiled" else transformer
            graphs = WindowGraphs(codec, [1], [new])
            graphs.capture()
            with torch.inference_mode():
                pcm = call(graphs)
                first = pcm if first is None else first
                ms = statistics.median(timed_ms(functools.partial(call, graphs), device, repeats))
            rows.append({"bench": "codec_window", "snakes": name, "fused": sum(m.inverse is not None for m in snakes),
                         "post": post, "frames": new, "context_frames": context, "graph": graphs.runs(window),
                         "window_ms": round(ms, 2),
                         "max_pcm_difference": int(np.abs(pcm.astype(np.int32) - first.astype(np.int32)).max())})
            del graphs
            gc.collect()
    finally:
        for m, inverse in zip(snakes, inverses):
            m.inverse = inverse
        quantizer.post_module = transformer
    if profile is not None:
        from engine.bench.drama3.profiling import profile_window

        profile.write_text(profile_window(codec, device, new, context) + "\n", encoding="utf-8")
    return rows


def print_window(rows: list[Row]) -> None:
    if not rows:
        return
    w = rows[0]
    print(f"a {w['frames']}-frame window after {w['context_frames']} frames, from its graph:")
    print(f"{'snakes':>9} {'fused':>6} {'post':>9} {'ms':>8} {'graph':>6} {'max PCM16 diff':>15}")
    for r in rows:
        print(f"{r['snakes']:>9} {r['fused']:>6} {r['post']:>9} {r['window_ms']:>8.2f} {r['graph']!s:>6} "
              f"{r['max_pcm_difference']:>15}")

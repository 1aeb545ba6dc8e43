"""`retake bench codec --window`: a window's graph with the decoder's Snakes in one pass, op by
op, and the whole decode compiled by Inductor.

A long window (64 new frames after a take's first 320, through the take's codec state:
every window of a take after its first seconds) decodes from its graph with the Snakes as
`ready` leaves them (one Triton pass each on a GPU: engine/kernels/snake.py) and launched op
by op (the layer's own arithmetic); on a GPU also from the graph of the window's decode
compiled by Inductor (`retake serve --vocoder-compile on`, the default: codec_graphs.py `compiled`), and the
short windows (10 and 1 new frames, whose calls are bound by their kernels' count) both ways.
Each row has the largest PCM16 difference from the first row of its frame count;
`--profile FILE` adds the kernels of the long window launched without its graph.

Design choices:
- The window graph is the one the engine captures for the frame count (one row), built
  afresh per form: a graph holds the kernels of its capture. Each call starts from the same
  state (the take's after 320 frames), copied in as a take's is.
- On a CPU no Snake is fused: the long window's two rows run the same code (the graphs are
  off too), and the compiled rows are left out (Inductor's CPU build takes minutes on 2 cores).
- One compiled decode serves every form's graph, as in the engine (`dynamic=True`; one-frame
  windows compile apart).
- `--sweep` times the engine's own window graphs instead (one `WindowGraphs` over the stream's
  frame counts, compiled on a GPU, as `retake serve` captures them): each count's replay, with
  cuDNN's heuristics picking the convolutions and again with `torch.backends.cudnn.benchmark`
  on for the capture (each convolution shape timed once in the warm-up call). Why: on an H100
  the replays ran 5.1 ms for 12 frames and 7.7 for 32 but 5.6 for 64. Measured (stop 52, H100):
  the benchmark mode picked nothing faster (within 1.3% at every count), so the engine keeps
  cuDNN's heuristics.
- Kept from stop 37's forms bench, which also timed every convolution folded and as a matrix
  product (dropped: cuDNN's were as fast or faster, docs/perf.md); stop 38's form with only the
  post transformer compiled (7.08 -> 6.65 ms on an H100, without `emulate_precision_casts`:
  PCM16 differences of 152) gave way to the whole decode compiled.
"""

from __future__ import annotations

import functools
import gc
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec

Row = dict[str, Any]


def bench_window(codec: Codec, device: torch.device, repeats: int = 10, profile: Path | None = None) -> list[Row]:
    """Windows' graphs with the Snakes fused (as `ready` leaves them), op by op, and compiled."""
    import numpy as np

    from engine.drama3.codec_graphs import WindowGraphs
    from engine.drama3.codec_layers import Snake
    from engine.drama3.codec_stream import StreamState, new_state, window_pcm
    from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE, Window

    long, context = STREAM_FOLLOWUP_STRIDE, 320
    generator = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randint(0, n, (context + long,), generator=generator)
                         for n in codec.codebook_sizes]).to(device)  # [num_codebooks, frames]
    before = StreamState()
    with torch.inference_mode():
        window_pcm(codec, codes, Window(0, context), before)  # the take's first 320 frames

    def call(graphs: WindowGraphs, window: Window) -> np.ndarray:  # the window, from the state after those frames
        stream = StreamState()
        stream.codec, stream.frames = new_state(codec, 1), context
        stream.codec.copy_(before.state(codec))
        return graphs.pcm((codes, window, stream))

    snakes = [m for m in codec.decoder.modules() if isinstance(m, Snake)]
    inverses = [m.inverse for m in snakes]  # (None on a CPU: nothing fused)
    cuda = device.type == "cuda"
    forms = [(long, "fused", True, False), (long, "op by op", False, False)]
    forms += [(long, "fused", True, True)] if cuda else []
    forms += [(new, "fused", True, compiled) for new in (10, 1) for compiled in ((False, True) if cuda else (False,))]
    rows: list[Row] = []
    firsts: dict[int, np.ndarray] = {}
    try:
        for new, name, keep, compiled in forms:
            for m, inverse in zip(snakes, inverses):
                m.inverse = inverse if keep else None
            window = Window(emit=context, end=context + new, last=False)
            graphs = WindowGraphs(codec, [1], [new], compiled=compiled)
            graphs.capture()
            with torch.inference_mode():
                pcm = call(graphs, window)
                first = firsts.setdefault(new, pcm)
                ms = statistics.median(timed_ms(functools.partial(call, graphs, window), device, repeats))
            rows.append({"bench": "codec_window", "snakes": name, "fused": sum(m.inverse is not None for m in snakes),
                         "post": "compiled" if compiled else "eager", "frames": new, "context_frames": context,
                         "graph": graphs.runs(window), "window_ms": round(ms, 2),
                         "max_pcm_difference": int(np.abs(pcm.astype(np.int32) - first.astype(np.int32)).max())})
            del graphs
            gc.collect()
    finally:
        for m, inverse in zip(snakes, inverses):
            m.inverse = inverse
    if profile is not None:
        from engine.bench.drama3.profiling import profile_window

        profile.write_text(profile_window(codec, device, long, context) + "\n", encoding="utf-8")
    return rows


SWEEP_FRAMES = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # the stream's counts and those between


def bench_sweep(codec: Codec, device: torch.device, frames: tuple[int, ...] = SWEEP_FRAMES) -> list[Row]:
    """Each frame count's window graph replay (ms), cuDNN's heuristics against its benchmark mode."""
    from engine.drama3.codec_graphs import WindowGraphs

    cuda = device.type == "cuda"
    rows: list[Row] = []
    before = torch.backends.cudnn.benchmark
    try:
        for benchmark in (False, True) if cuda else (False,):
            torch.backends.cudnn.benchmark = benchmark
            graphs = WindowGraphs(codec, [1], list(frames), compiled=cuda)
            graphs.capture()  # times the replays on a GPU (`time_replays`)
            for count in frames:
                rows.append({"bench": "codec_sweep", "cudnn_benchmark": benchmark, "frames": count,
                             "graph": count in graphs.graphs.graphs,
                             "replay_ms": round(graphs.graphs.replay_ms[count], 3) if count in graphs.graphs.replay_ms
                             else None})
            del graphs
            gc.collect()
    finally:
        torch.backends.cudnn.benchmark = before
    return rows


def print_sweep(rows: list[Row]) -> None:
    """A line per frame count: its replay with cuDNN's heuristics, and with its benchmark mode."""
    by = {(r["frames"], r["cudnn_benchmark"]): r["replay_ms"] for r in rows}
    print("window graphs after a take's state (the engine's, one row), replay ms:")
    print(f"{'frames':>7} {'heuristics':>11} {'benchmark':>10}")
    for count in sorted({r["frames"] for r in rows}):
        cells = [by.get((count, mode)) for mode in (False, True)]
        print(f"{count:>7} " + " ".join(f"{'-' if ms is None else f'{ms:.2f}':>{w}}" for ms, w in zip(cells, (11, 10))))


def print_window(rows: list[Row]) -> None:
    if not rows:
        return
    print(f"windows after {rows[0]['context_frames']} frames, from their graphs ('compiled': the whole decode):")
    print(f"{'frames':>7} {'snakes':>9} {'fused':>6} {'decode':>9} {'ms':>8} {'graph':>6} {'max PCM16 diff':>15}")
    for r in rows:
        print(f"{r['frames']:>7} {r['snakes']:>9} {r['fused']:>6} {r['post']:>9} {r['window_ms']:>8.2f} "
              f"{r['graph']!s:>6} {r['max_pcm_difference']:>15}")

"""`retake bench codec --forms`: the decoder's dilated convolutions plain and folded.

A long window (64 new frames after 320 of context: every window of a take after its first
seconds) decodes from its graph once per form (codec.py `fold_dilated`: none folded, from
dilation 9, from dilation 3), and each dilated convolution of that window is timed alone
in both forms at its own shape (codec_layers.py `fold`), so the table says which
convolutions a form speeds up and the window's row what the vocoder gains.

Design choices:
- The window graphs are those the engine captures for these lengths (320 and 384 frames,
  one row), built afresh per form: a graph holds the kernels chosen at its capture.
- A convolution's input is what it received in one decode of the window (a forward
  pre-hook), so the shapes are the window's, not guessed.
- The forms must agree: each row says the largest difference of the window's PCM16 from
  the plain form's (folding changes the summation order on a GPU, not the sums).
"""

from __future__ import annotations

import functools
import gc
import statistics
from typing import TYPE_CHECKING, Any

import torch

from engine.bench.timing import timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec

FORMS: dict[str, int | None] = {"plain": None, "fold 9": 9, "fold 3": 3}  # name -> fold_dilated's dilation
Row = dict[str, Any]


def bench_forms(codec: Codec, device: torch.device, repeats: int = 10) -> list[Row]:
    """A long window's graph per form (ms, PCM difference from plain), then each dilated
    convolution plain and folded (ms)."""
    import numpy as np

    from engine.drama3.codec import FOLD_FROM, fold_dilated
    from engine.drama3.codec_graphs import WindowGraphs
    from engine.drama3.codec_layers import CausalConv
    from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE, STREAM_OVERLAP_FRAMES, Window

    new, context = STREAM_FOLLOWUP_STRIDE, STREAM_OVERLAP_FRAMES
    window = Window(start=0, emit=context, end=context + new, last=False)
    generator = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randint(0, n, (context + new,), generator=generator)
                         for n in codec.codebook_sizes]).to(device)  # [num_codebooks, frames]
    rows: list[Row] = []
    plain: np.ndarray | None = None
    for name, dilation in FORMS.items():
        fold_dilated(codec, dilation)
        graphs = WindowGraphs(codec, [context, context + new])
        graphs.capture()
        pcm = graphs.pcm(codes, window)
        plain = pcm if plain is None else plain
        ms = statistics.median(timed_ms(functools.partial(graphs.pcm, codes, window), device, repeats))
        rows.append({"bench": "codec_form", "form": name, "frames": new, "context_frames": context,
                     "graph": graphs.runs(window), "window_ms": round(ms, 2),
                     "max_pcm_difference": int(np.abs(pcm.astype(np.int32) - plain.astype(np.int32)).max())})
        del graphs
        gc.collect()

    inputs: list[tuple[CausalConv, torch.Tensor]] = []
    dilated = [m for m in codec.decoder.modules() if isinstance(m, CausalConv) and m.conv.dilation[0] > 1]
    hooks = [m.register_forward_pre_hook(lambda m, args: inputs.append((m, args[0].clone()))) for m in dilated]
    fold_dilated(codec, None)
    with torch.inference_mode():  # the convolutions' frames of the long window (WindowGraphs.kept)
        codec.decode_tail(codes[None], context - codec.conv_context, new + codec.conv_context)
    for hook in hooks:
        hook.remove()
    for conv, x in inputs:
        row: Row = {"bench": "codec_conv", "channels": conv.conv.in_channels, "dilation": int(conv.conv.dilation[0]),
                    "steps": x.shape[-1], "dtype": str(x.dtype).removeprefix("torch.")}
        for folded in (False, True):
            conv.folded = folded
            with torch.inference_mode():
                conv(x)
                row["folded_ms" if folded else "plain_ms"] = round(statistics.median(
                    timed_ms(functools.partial(conv, x), device, repeats)), 3)
        rows.append(row)
    fold_dilated(codec, FOLD_FROM if device.type == "cuda" else None)  # back as `ready` leaves it
    return rows


def print_forms(rows: list[Row]) -> None:
    windows = [r for r in rows if r["bench"] == "codec_form"]
    convs = [r for r in rows if r["bench"] == "codec_conv"]
    if windows:
        w = windows[0]
        print(f"a {w['context_frames']}+{w['frames']}-frame window from its graph, by form of the decoder's "
              f"dilated convolutions:")
        print(f"{'form':>8} {'ms':>8} {'graph':>6} {'max PCM16 diff':>15}")
        for r in windows:
            print(f"{r['form']:>8} {r['window_ms']:>8.2f} {r['graph']!s:>6} {r['max_pcm_difference']:>15}")
    if convs:
        print("each dilated convolution of that window alone (ms):")
        print(f"{'channels':>9} {'dilation':>9} {'steps':>8} {'dtype':>9} {'plain':>8} {'folded':>8}")
        for r in convs:
            print(f"{r['channels']:>9} {r['dilation']:>9} {r['steps']:>8} {r['dtype']:>9} {r['plain_ms']:>8.3f} "
                  f"{r['folded_ms']:>8.3f}")

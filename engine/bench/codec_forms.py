"""`retake bench codec --forms`: the decoder's convolutions in each form of the same sums.

A long window (64 new frames after 320 of context: every window of a take after its first
seconds) decodes from its graph once per policy (codec.py `conv_forms`: cuDNN's convolutions,
the dilated ones folded from dilation 9 or 3, every convolution of more than one tap as a
matrix product; and cuDNN's with the Snakes launched op by op instead of one Triton pass
each, engine/kernels/snake.py), and each such convolution of that window is timed alone in each form that
serves it (codec_layers.py FORMS), so the table says which convolutions a form speeds up and
the window's row what the vocoder gains. `--profile FILE` adds the kernels of that window
launched without its graph.

Design choices:
- The window graphs are those the engine captures for these lengths (320 and 384 frames,
  one row), built afresh per policy: a graph holds the kernels chosen at its capture.
- A convolution's input is what it received in one decode of the window (a forward
  pre-hook), so the shapes are the window's, not guessed.
- The forms must agree: each row says the largest difference of the window's PCM16 from
  cuDNN's (another form changes the summation order on a GPU, not the sums).
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

POLICIES: dict[str, tuple[int | None, bool, bool]] = {  # name -> conv_forms' (fold_from, gemm), Snakes fused
    "conv": (None, False, True), "eager snakes": (None, False, False), "fold 9": (9, False, True),
    "fold 3": (3, False, True), "gemm": (None, True, True)}
Row = dict[str, Any]


def bench_forms(codec: Codec, device: torch.device, repeats: int = 10, profile: Path | None = None) -> list[Row]:
    """A long window's graph per policy (ms, PCM difference from cuDNN's), then each convolution
    of more than one tap in each of its forms (ms)."""
    import numpy as np

    from engine.drama3.codec import CONV_FORMS, conv_forms
    from engine.drama3.codec_graphs import WindowGraphs
    from engine.drama3.codec_layers import CausalConv, Snake
    from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE, STREAM_OVERLAP_FRAMES, Window

    new, context = STREAM_FOLLOWUP_STRIDE, STREAM_OVERLAP_FRAMES
    window = Window(start=0, emit=context, end=context + new, last=False)
    generator = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randint(0, n, (context + new,), generator=generator)
                         for n in codec.codebook_sizes]).to(device)  # [num_codebooks, frames]
    rows: list[Row] = []
    first: np.ndarray | None = None
    snakes = [m for m in codec.decoder.modules() if isinstance(m, Snake)]
    fused = [m.fused for m in snakes]
    for name, (fold_from, gemm, fused_snakes) in POLICIES.items():
        conv_forms(codec, fold_from, gemm)
        for m, on in zip(snakes, fused):
            m.fused = on and fused_snakes  # (a CPU has none fused)
        graphs = WindowGraphs(codec, [context, context + new])
        graphs.capture()
        pcm = graphs.pcm(codes, window)
        first = pcm if first is None else first
        ms = statistics.median(timed_ms(functools.partial(graphs.pcm, codes, window), device, repeats))
        rows.append({"bench": "codec_form", "form": name, "frames": new, "context_frames": context,
                     "graph": graphs.runs(window), "window_ms": round(ms, 2),
                     "max_pcm_difference": int(np.abs(pcm.astype(np.int32) - first.astype(np.int32)).max())})
        del graphs
        gc.collect()

    conv_forms(codec)
    for m, on in zip(snakes, fused):
        m.fused = on
    if profile is not None:
        from engine.bench.drama3.profiling import profile_window

        profile.write_text(profile_window(codec, device, new, context) + "\n", encoding="utf-8")
    inputs: list[tuple[CausalConv, torch.Tensor]] = []
    convs = [m for m in codec.decoder.modules()
             if isinstance(m, CausalConv) and m.conv.kernel_size[0] > 1 and m.stride == 1 and m.conv.groups == 1]
    hooks = [m.register_forward_pre_hook(lambda m, args: inputs.append((m, args[0].clone()))) for m in convs]
    with torch.inference_mode():  # the convolutions' frames of the long window (WindowGraphs.kept)
        codec.decode_tail(codes[None], context - codec.conv_context, new + codec.conv_context)
    for hook in hooks:
        hook.remove()
    for conv, x in inputs:
        row: Row = {"bench": "codec_conv", "channels_in": conv.conv.in_channels,
                    "channels_out": conv.conv.out_channels, "taps": int(conv.conv.kernel_size[0]),
                    "dilation": int(conv.conv.dilation[0]), "steps": x.shape[-1],
                    "dtype": str(x.dtype).removeprefix("torch.")}
        for form in ("conv", "fold", "gemm") if row["dilation"] > 1 else ("conv", "gemm"):
            conv.form = form
            with torch.inference_mode():
                conv(x)
                row[f"{form}_ms"] = round(statistics.median(timed_ms(functools.partial(conv, x), device, repeats)), 3)
        rows.append(row)
    conv_forms(codec, *(CONV_FORMS if device.type == "cuda" else (None, False)))  # back as `ready` leaves it
    return rows


def print_forms(rows: list[Row]) -> None:
    windows = [r for r in rows if r["bench"] == "codec_form"]
    convs = [r for r in rows if r["bench"] == "codec_conv"]
    if windows:
        w = windows[0]
        print(f"a {w['context_frames']}+{w['frames']}-frame window from its graph, by form of the decoder's "
              f"convolutions:")
        print(f"{'form':>13} {'ms':>8} {'graph':>6} {'max PCM16 diff':>15}")
        for r in windows:
            print(f"{r['form']:>13} {r['window_ms']:>8.2f} {r['graph']!s:>6} {r['max_pcm_difference']:>15}")
    if convs:
        print("each convolution of that window alone (ms):")
        print(f"{'in':>6} {'out':>6} {'taps':>5} {'dilation':>9} {'steps':>8} {'dtype':>9} {'conv':>8} {'fold':>8} "
              f"{'gemm':>8}")
        for r in convs:
            fold = f"{r['fold_ms']:>8.3f}" if "fold_ms" in r else f"{'-':>8}"
            print(f"{r['channels_in']:>6} {r['channels_out']:>6} {r['taps']:>5} {r['dilation']:>9} {r['steps']:>8} "
                  f"{r['dtype']:>9} {r['conv_ms']:>8.3f} {fold} {r['gemm_ms']:>8.3f}")

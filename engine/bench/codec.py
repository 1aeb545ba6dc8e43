"""`retake bench codec`: streamed windows against whole takes, and how fast they decode.

One take of `--frames` random codes is streamed exactly as a take streams (stream.py's
schedule, each window decoded after the take's codec state: codec_stream.py), and, for
comparison, as the seed streamed it: each window decoded again with `--overlaps` frames of
left context (default 32, SGLang Omni's, and 320, the seed's). Each way is compared with
the whole-take decode: the SNR of the streamed PCM16, the decode time per window
(synchronised on a GPU), and the real-time factor (window decode time over audio time).
Codec: a checkpoint's codec.pth, the tiny demo codec (default), or random weights at the
full released size (`--random-weights --preset full`, generated on the device). Random
weights make noise: their SNR shows the streaming arithmetic, not the trained codec's (the
seed measured ~3.5 dB at 32 frames of context and ~50 dB at 320 on the real one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.bench.options import add_device

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    import torch

    from engine.drama3.codec import Codec

HELP = "streamed vs whole-take codec decode: SNR, ms per window, real-time factor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, help="a directory with codec.pth (default: the tiny demo codec)")
    parser.add_argument("--random-weights", action="store_true", help="random weights instead of a checkpoint")
    parser.add_argument("--preset", choices=("tiny", "full"), default="tiny",
                        help="size for --random-weights: tiny, or full (the released modded_dac_vq)")
    add_device(parser)
    parser.add_argument("--frames", type=int, default=600, help="frames in the take (default 600, ~27.9 s)")
    parser.add_argument("--overlaps", default="32,320",
                        help="the seed's way for comparison: left contexts to decode each window with, in frames "
                             "(empty: none)")
    parser.add_argument("--first-window", type=int, help="a smaller first window, in frames")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per overlap after a warm-up pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default 0: torch's choice)")
    parser.add_argument("--window", action="store_true",
                        help="instead: a long window's graph with the decoder's Snakes in one pass and op by op "
                             "(codec_window.py)")
    parser.add_argument("--profile", type=Path, help="with --window: the kernels of that window into this file")
    parser.add_argument("--sweep", action="store_true",
                        help="instead: the engine's window graphs, each frame count's replay, with cuDNN's "
                             "heuristics and with its benchmark mode (codec_window.py)")
    parser.add_argument("--json", type=Path, help="also write the rows here")


def load(args: argparse.Namespace, device: torch.device) -> tuple[Codec, str]:
    from engine.drama3.codec import CodecConfig, load_codec, ready
    from engine.drama3.codec_tiny import TINY_CODEC, random_codec, write_tiny_codec

    if args.checkpoint is not None:
        return load_codec(args.checkpoint, device), f"checkpoint {args.checkpoint}"
    if args.random_weights:
        config = CodecConfig.from_dict(TINY_CODEC if args.preset == "tiny" else None)
        return ready(random_codec(config, args.seed, device), device), f"random weights, {args.preset} size"
    with tempfile.TemporaryDirectory() as directory:
        write_tiny_codec(Path(directory), seed=0)
        return load_codec(directory, device), "tiny demo codec (random weights)"


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from engine.device import pick_device
    from engine.drama3.codec_stream import StreamState, window_pcm
    from engine.drama3.stream import Window, check_settings, take_windows
    from engine.errors import RequestError
    from engine.pcm import pcm16

    if args.checkpoint is not None and args.random_weights:
        raise RequestError("choose --checkpoint or --random-weights, not both")
    if args.frames < 1 or args.repeats < 1:
        raise RequestError("--frames and --repeats must be at least 1")
    try:
        overlaps = [int(o) for o in args.overlaps.split(",") if o.strip()]
    except ValueError as error:
        raise RequestError(f"--overlaps must be frame counts separated by commas; got {args.overlaps!r}") from error
    if any(overlap < 0 for overlap in overlaps):
        raise RequestError(f"--overlaps must be frame counts >= 0; got {args.overlaps!r}")
    check_settings(args.first_window)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    codec, source = load(args, device)
    if args.window or args.sweep:
        from engine.bench.codec_window import bench_sweep, bench_window, print_sweep, print_window

        rows = bench_sweep(codec, device) if args.sweep else bench_window(codec, device, profile=args.profile)
        print(f"codec: {source}; {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
        (print_sweep if args.sweep else print_window)(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        return 0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    generator = torch.Generator().manual_seed(args.seed)
    codes = torch.stack([torch.randint(0, size, (args.frames,), generator=generator)
                         for size in codec.codebook_sizes]).to(device)  # [10, frames]
    audio_s = args.frames * codec.frame_samples / codec.sample_rate
    pcm16(codec.decode(codes))  # warm-up
    sync()
    started = time.perf_counter()
    whole = pcm16(codec.decode(codes)).cpu().numpy().astype(np.float64)
    whole_ms = (time.perf_counter() - started) * 1000
    def with_context(window: Window, overlap: int) -> torch.Tensor:
        """The seed's window: decoded again from `overlap` frames before it, the new samples kept."""
        start = max(0, window.emit - overlap)
        kept = max(0, window.emit - start - codec.conv_context)  # the convolutions' own context
        audio = codec.decode_tail(codes[None, :, start:window.end], kept, window.end - start - kept)
        return pcm16(audio[0, (window.emit - start - kept) * codec.frame_samples:])

    rows = []
    windows = [w for w in take_windows(args.frames, args.first_window) if w.frames]
    for overlap in [None, *overlaps]:
        times: list[list[float]] = [[] for _ in windows]
        for attempt in range(args.repeats + 1):  # the first pass warms kernels for each shape
            pieces, state = [], StreamState()
            for i, window in enumerate(windows):
                sync()
                started = time.perf_counter()
                pieces.append(window_pcm(codec, codes, window, state) if overlap is None
                              else with_context(window, overlap))
                sync()
                if attempt:
                    times[i].append((time.perf_counter() - started) * 1000)
        streamed = torch.cat(pieces).cpu().numpy().astype(np.float64)
        assert streamed.shape == whole.shape, "streamed windows must tile the take"
        residual = ((whole - streamed) ** 2).sum()
        snr = float("inf") if residual == 0 else 10 * np.log10((whole**2).sum() / residual)
        per_window = [statistics.median(t) for t in times]
        steady = [ms for ms, w in zip(per_window, windows) if w.frames == max(x.frames for x in windows)]
        rows.append({
            "way": "state" if overlap is None else f"context {overlap}", "overlap_frames": overlap,
            "snr_db": round(float(snr), 2),
            "window_ms": round(statistics.mean(per_window), 2),
            "window_ms_max": round(max(per_window), 2),
            "steady_window_ms": round(statistics.mean(steady), 2),
            "first_window_ms": round(per_window[0], 2),
            "rtf": round(sum(per_window) / 1000 / audio_s, 4),
            "windows": len(windows), "frames": args.frames, "first_window": args.first_window,
            "whole_take_ms": round(whole_ms, 2), "device": device.type, "codec": source,
        })
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"codec: {source}; {name}; take of {args.frames} frames ({audio_s:.1f} s); "
          f"whole-take decode {whole_ms:.1f} ms; decoder {codec.decoder_dtype}")
    print(f"{'way':>12} {'SNR dB':>8} {'ms/window':>10} {'max ms':>8} {'steady ms':>10} {'first ms':>9} "
          f"{'RTF':>8} {'windows':>8}")
    for r in rows:
        print(f"{r['way']:>12} {r['snr_db']:>8.2f} {r['window_ms']:>10.2f} {r['window_ms_max']:>8.2f} "
              f"{r['steady_window_ms']:>10.2f} {r['first_window_ms']:>9.2f} {r['rtf']:>8.4f} {r['windows']:>8}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0

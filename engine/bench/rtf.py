"""`retake bench rtf`: the real-time factor of whole takes on this machine.

Takes of up to `--frames` frames (seeded, default sampling) run through the engine
contract exactly as the studio runs them: prompt, prefill, decode steps, streamed
windows vocoded as their frames exist. The real-time factor is wall time over audio
time: below 1 the take streams faster than it plays. Printed per take and as a median;
`--json` writes the numbers too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from engine.bench.options import add_device

HELP = "real-time factor of whole Drama 3 takes (default: the tiny demo model on this CPU)"
TEXT = "Places, everyone. This is the take where the line finally lands."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, help="a Drama 3 checkpoint (default: the tiny demo)")
    add_device(parser)
    parser.add_argument("--frames", type=int, default=200, help="frames per take (default 200, ~9.3 s of audio)")
    parser.add_argument("--takes", type=int, default=3, help="takes to time after a warm-up (default 3)")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads for torch (default 0: the engine's, half the cores; on a busy shared CPU "
                             "1 can be several times faster)")
    parser.add_argument("--json", type=Path, help="also write the results here")


def run(args: argparse.Namespace) -> int:
    import torch

    from engine import Done, EngineSpec, Sampling, load_engine

    engine = load_engine(EngineSpec(checkpoint=args.checkpoint, device=args.device, threads=args.threads or None))
    warm = engine.warm_up()
    rows: list[dict[str, Any]] = []  # one printed and JSON row per take
    for take in range(args.takes):
        # A seed per take keeps runs comparable (random weights rarely sample end of speech).
        prompt = engine.prompt(args.text, None, [], Sampling(max_new_tokens=args.frames, seed=take))
        started = time.perf_counter()
        for event in engine.generate(prompt):
            if isinstance(event, Done):
                done = event
        wall_s = time.perf_counter() - started
        audio_s = (done.timings["frames"] or 0) * engine.frame_samples / engine.sample_rate
        rows.append({"take": take, "frames": done.timings["frames"], "finish_reason": done.finish_reason,
                     "audio_s": round(audio_s, 3), "wall_s": round(wall_s, 3),
                     "rtf": round(wall_s / audio_s, 3) if audio_s else None,
                     "prefill_ms": done.timings["prefill_ms"], "first_audio_ms": done.timings["first_audio_ms"],
                     "decode_frames_per_s": done.timings["decode_frames_per_s"]})
    device = "cuda" if engine.device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"drama3 {'tiny demo (random weights)' if engine.demo_weights else 'checkpoint'} on {device}; "
          f"prompt {len(prompt.rows)} rows; warm-up {warm}")
    print(f"{'take':>4} {'frames':>6} {'audio s':>8} {'wall s':>7} {'RTF':>6} {'prefill ms':>10} "
          f"{'first audio ms':>14} {'frames/s':>8}  finish")
    for row in rows:
        print(f"{row['take']:>4} {row['frames']:>6} {row['audio_s']:>8.2f} {row['wall_s']:>7.2f} "
              f"{row['rtf'] or float('nan'):>6.3f} {row['prefill_ms']:>10} {row['first_audio_ms'] or '-':>14} "
              f"{row['decode_frames_per_s'] or 0:>8.1f}  {row['finish_reason']}")
    rtfs = [row["rtf"] for row in rows if row["rtf"]]
    median = statistics.median(rtfs) if rtfs else None
    if median is not None:
        verdict = "faster than real time" if median < 1 else "SLOWER than real time"
        print(f"median RTF {median:.3f} ({verdict}; real time is 21.53 frames/s)")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "warm_up": warm, "takes": rows, "median_rtf": median},
                                        indent=2))
    return 0

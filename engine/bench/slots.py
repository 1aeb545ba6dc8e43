"""`retake bench slots`: throughput of takes decoding together, per slot count.

For each slot count the engine is loaded with that many slots and runs the same `--takes`
seeded takes of `--frames` frames, all submitted at once: a take starts whenever a slot is
free (in order), and every engine step advances all takes in slots (engine.start /
engine.step, as the server's loop drives them). Printed per slot count: seconds of audio
per second of wall time (and its ratio to one slot), the median batched step, and first
audio per take counted from the common submit time (p50 / p95: waiting for a slot
included) and from its own start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.bench.options import add_device

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine import Drama3Engine

HELP = "throughput of several Drama 3 takes decoding together, per slot count (default: tiny model, this CPU)"
TEXTS = ("Places, everyone.", "Who left the lamp burning?", "Not me. I was asleep.", "Then light it again.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, help="a Drama 3 checkpoint (default: the tiny demo)")
    add_device(parser)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4], help="slot counts (default 1 2 4)")
    parser.add_argument("--takes", type=int, default=4, help="takes per slot count (default 4)")
    parser.add_argument("--frames", type=int, default=100, help="frames per take at most (default 100)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads for torch (default 0: the engine's, half the cores)")
    parser.add_argument("--json", type=Path, help="also write the results here")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_takes(engine: Drama3Engine, takes: int, frames: int) -> dict[str, Any]:
    from engine import AudioWindow, Done, Sampling

    prompts = [engine.prompt(TEXTS[i % len(TEXTS)], None, [], Sampling(max_new_tokens=frames, seed=i))
               for i in range(takes)]
    waiting, heard = list(prompts), set()
    started_at: dict[Any, float] = {}
    first_audio: list[float] = []
    first_from_start: list[float] = []
    steps: list[float] = []
    audio_frames = done = 0
    submitted = time.perf_counter()

    def hear(results: list[tuple[Any, list[Any]]]) -> None:  # (windows handed out mid-step too, as the server's)
        nonlocal audio_frames, done
        for take, events in results:
            for event in events:
                if isinstance(event, AudioWindow) and len(event.pcm) and take not in heard:
                    heard.add(take)
                    now = time.perf_counter()
                    first_audio.append(now - submitted)
                    first_from_start.append(now - started_at[take])
                if isinstance(event, Done):
                    done += 1
                    audio_frames += event.codes.shape[1]

    while done < takes:
        while waiting and engine.free_slots:
            take = engine.start(waiting.pop(0))
            started_at[take] = time.perf_counter()
        timer = time.perf_counter()
        results = engine.step(hand=hear)
        steps.append(time.perf_counter() - timer)
        hear(results)
    wall = time.perf_counter() - submitted
    audio_s = audio_frames * engine.frame_samples / engine.sample_rate
    return {"slots": engine.slots, "takes": takes, "audio_s": round(audio_s, 2), "wall_s": round(wall, 2),
            "audio_per_s": round(audio_s / wall, 3), "step_ms": round(statistics.median(steps) * 1000, 2),
            "first_audio_p50_ms": round(percentile(first_audio, 0.5) * 1000),
            "first_audio_p95_ms": round(percentile(first_audio, 0.95) * 1000),
            "first_audio_from_start_p50_ms": round(percentile(first_from_start, 0.5) * 1000)}


def run(args: argparse.Namespace) -> int:
    import torch

    from engine import EngineSpec, load_engine

    rows = []
    for slots in args.slots:
        engine = load_engine(EngineSpec(checkpoint=args.checkpoint, device=args.device, slots=slots,
                                        threads=args.threads or None))
        engine.warm_up()
        rows.append(run_takes(engine, args.takes, args.frames))
        engine.vocoder.shutdown()
        del engine
    base = rows[0]["audio_per_s"]
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else \
        f"cpu ({torch.get_num_threads()} threads)"
    print(f"drama3 {'checkpoint ' + str(args.checkpoint) if args.checkpoint else 'tiny demo (random weights)'} on "
          f"{device}; {args.takes} takes of up to {args.frames} frames, all submitted at once")
    print(f"{'slots':>5} {'audio s':>8} {'wall s':>7} {'audio/s':>8} {'ratio':>6} {'step ms':>8} "
          f"{'first audio p50':>15} {'p95':>6} {'from start p50':>14}")
    for row in rows:
        row["ratio_to_first"] = round(row["audio_per_s"] / base, 2) if base else None
        print(f"{row['slots']:>5} {row['audio_s']:>8.1f} {row['wall_s']:>7.1f} {row['audio_per_s']:>8.2f} "
              f"{row['ratio_to_first'] or 0:>6.2f} {row['step_ms']:>8.1f} {row['first_audio_p50_ms']:>15} "
              f"{row['first_audio_p95_ms']:>6} {row['first_audio_from_start_p50_ms']:>14}")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0

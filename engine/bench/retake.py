"""`retake bench retake`: first audio of a retake with 0 / 1,000 / 4,000 rows of directing
history, with the prefix cache on and off, and the cache's memory per session.

    retake bench retake                                              # the tiny demo, this CPU
    retake bench retake --random-weights --preset full --device cuda --json retake.json

For each history size a scene is laid out as the studio does (no voice, history turns of
`--turn-frames` frames of random codes and their text, then the line) and run through the
engine as served (`engine.generate`, warm-up first):
- off: the cache off (`--prefix-cache-gib 0`): every take prefills its whole prompt;
- retake: the same line again (another seed): the whole prompt comes from the cache;
- next line: a retake kept, a new line: the history up to it comes from the cache, the
  kept take and the new line are prefilled;
- next line, warmed: as the server does after a keep, the next line's prompt is first
  prefilled into the cache up to the end of its history (`Drama3Engine.warm`, while the
  director would read): the new line alone is prefilled (a line not in the script yet);
- next line, written: the same with the line's text in the script, which the server warms
  too: the take restores its whole prompt.
Printed: first audio (the prompt's building, then prefill start to the first PCM window; median
of `--repeats`), the prompt's building (`prompt_ms`), the host's time to begin the prefill
(`restore_ms`: the prefix cache's plan and restore, launched; stop 43's second H100 spent 10 ms
more from start to prefilled at 4,000 rows than at 0, this says whether in it) and the prefill
(`prefill_ms`, start to prefilled), the rows restored, the
decode steps before the first window was due (`first_window_steps`: above the first window's
frames when the sampled frames were held, as a `<|semantic:0|>` frame is; a first audio that
grows with it is the sampler's, not the engine's); the ratio of the 4,000-row retake to the
retake with no history (the target on the H200: within 1.2x), with the cache on and off; bytes
per row and per DeltaNet state, and what the largest scene's snapshots held.

`--profile FILE`: one more retake and one more written next line at each history size under
torch.profiler (CPU and CUDA), its steps in labelled ranges (`retake: plan`, `restore`,
`begin_prefill`, `step`, `read_status`: the engine's methods wrapped for the bench alone),
written as one table of the ranges and the top ops per size, so what grows with the history
shows side by side.

Design choices:
- One engine, the cache switched off by detaching it (`decoder.prefix = None`), so both
  modes share the weights, graphs and warm-up; it is emptied before each scene.
- First audio comes from the take's own timings (Done.timings), as the server reports it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.bench.options import add_device, add_weights
from engine.drama3.fast import DEFAULT_KERNELS, KERNELS

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine import Drama3Engine, HistoryTurn

HELP = "first audio of a retake with 0 / 1,000 / 4,000 rows of history, prefix cache on and off"
LINE = "Who left the lamp burning?"
Row = dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser, preset="tiny", checkpoint_help="a Drama 3 checkpoint (default: the tiny demo)",
                preset_help="model size with --random-weights (full needs a CUDA GPU)")
    add_device(parser)
    parser.add_argument("--history-rows", type=int, nargs="+", default=[0, 1000, 4000], metavar="N",
                        help="history sizes in prompt rows (default 0 1000 4000)")
    parser.add_argument("--turn-frames", type=int, default=200, help="frames of each history take (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="takes per measurement, median reported (default 3)")
    parser.add_argument("--frames", type=int, default=8, help="frames per take at most (default 8: past first audio)")
    parser.add_argument("--prefix-cache-gib", type=float, help="the cache's budget (default: the engine's)")
    parser.add_argument("--kernels", nargs="*", choices=KERNELS, metavar="NAME", default=None,
                        help=f"the decode step's Triton kernels on CUDA, of {', '.join(KERNELS)} (default: "
                             f"{' '.join(DEFAULT_KERNELS)})")
    parser.add_argument("--compile-prefill", action="store_true",
                        help="prefill chunks through the compiled layers on CUDA (as `retake serve --compile-prefill`)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="profile one retake at each history size (torch.profiler), its ranges and top ops here")


def history(engine: Drama3Engine, rows: int, turn_frames: int) -> list[HistoryTurn]:
    """Kept takes of random codes whose rows in a prompt add up to about `rows`."""
    from engine import HistoryTurn, Sampling

    rng = np.random.default_rng(rows)
    turns: list[HistoryTurn] = []
    base = len(engine.prompt(LINE, None, [], Sampling()).rows)
    while len(engine.prompt(LINE, None, turns, Sampling()).rows) - base < rows:
        turns.append(HistoryTurn(f"Line {len(turns) + 1} of the scene, as it was kept.",
                                 rng.integers(0, engine.config.codebook_size, (engine.config.num_codebooks,
                                                                               turn_frames))))
    return turns


def measure(engine: Drama3Engine, text: str, turns: list[HistoryTurn], seed: int, frames: int) -> Row:
    from engine import Done, Sampling

    prompt = engine.prompt(text, None, turns, Sampling(max_new_tokens=frames, seed=seed))
    done = next(e for e in engine.generate(prompt) if isinstance(e, Done))
    if done.error is not None:
        raise SystemExit(f"retake bench retake: a take failed: {done.error}")
    timings = done.timings
    return {"prompt_rows": len(prompt.rows), "cached_rows": timings.get("cached_rows", 0),
            "prefill_chunks": timings.get("prefill_chunks", 0), "prompt_ms": timings.get("prompt_ms"),
            "restore_ms": timings.get("restore_ms"), "prefill_ms": timings["prefill_ms"],
            "first_window_steps": timings.get("first_window_steps"),
            "first_audio_ms": timings["first_audio_ms"], "codes": done.codes}


def median_row(samples: list[Row], **fields: Any) -> Row:
    row = {**fields, **{key: samples[-1][key] for key in ("prompt_rows", "cached_rows", "prefill_chunks")}}
    for key in ("prompt_ms", "restore_ms", "prefill_ms", "first_window_steps", "first_audio_ms"):
        values = [s[key] for s in samples if s[key] is not None]
        row[key] = round(statistics.median(values), 1) if values else None
    return row


def scene(engine: Drama3Engine, rows: int, args: argparse.Namespace) -> tuple[list[Row], int]:
    """The three modes for one history size; and the bytes its snapshots held."""
    from engine import HistoryTurn

    decoder, prefix = engine.decoder, engine.decoder.prefix
    assert prefix is not None
    turns = history(engine, rows, args.turn_frames)
    out: list[Row] = []
    decoder.prefix = None
    try:
        off = [measure(engine, LINE, turns, seed, args.frames) for seed in range(args.repeats)]
    finally:
        decoder.prefix = prefix
    out.append(median_row(off, history_rows=rows, cache="off", take="retake"))
    prefix.clear()
    first = measure(engine, LINE, turns, 100, args.frames)  # cold: fills the cache
    out.append(median_row([first], history_rows=rows, cache="on", take="first (cold)"))
    again = [measure(engine, LINE, turns, 101 + seed, args.frames) for seed in range(args.repeats)]
    out.append(median_row(again, history_rows=rows, cache="on", take="retake"))
    # Each next line keeps another take of the line, so each resumes where the history ended.
    following = [measure(engine, "And the next line.", [*turns, HistoryTurn(LINE, take["codes"])], 200 + seed,
                         args.frames) for seed, take in enumerate(again)]
    out.append(median_row(following, history_rows=rows, cache="on", take="next line"))
    # Each of those kept in turn, the line after it warmed first (as after a keep in the studio):
    # up to its history (a line not in the script yet), then, the same again, with its text.
    warmed = warmed_lines(engine, turns, "And the next line.", following, "And the line after.", 300, False, args)
    out.append(median_row(warmed, history_rows=rows, cache="on", take="next line, warmed"))
    written = warmed_lines(engine, turns, "And the line after.", warmed, "And the last line.", 400, True, args)
    out.append(median_row(written, history_rows=rows, cache="on", take="next line, written"))
    return out, prefix.stats()["device_bytes"] + prefix.stats()["host_bytes"]


def warmed_lines(engine: Drama3Engine, turns: list[HistoryTurn], kept_text: str, kept: list[Row], text: str,
                 seed: int, line: bool, args: argparse.Namespace) -> list[Row]:
    """For each take of `kept` (said `kept_text`) kept after `turns`: the line `text` warmed, then taken."""
    from engine import HistoryTurn

    rows = []
    for number, take in enumerate(kept):
        history = [*turns, HistoryTurn(kept_text, take["codes"])]
        warm_prefix(engine, text, history, line)
        rows.append(measure(engine, text, history, seed + number, args.frames))
    return rows


def warm_prefix(engine: Drama3Engine, text: str, turns: list[HistoryTurn], line: bool) -> None:
    """Prefill the prompt into the prefix cache, as the server does after a keep: up to the end
    of its history, or (`line`: the script holds its text) all of it."""
    import torch

    from engine import Sampling

    take = engine.warm(engine.prompt(text, None, turns, Sampling(max_new_tokens=1)), line=line)
    while take is not None and not take.done:
        engine.step()
    # The warm is done once its chunks are launched; the GPU runs them while the director reads.
    # Without this wait the take queued behind them (stop 41's H100: a written line 36 ms, not ~12).
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


RANGES = (("prefix", "plan"), ("prefix", "restore"), ("decoder", "begin_prefill"), ("decoder", "step"),
          ("decoder", "read_status"))  # (owner, method): wrapped in profiler ranges by --profile


def profile_retakes(engine: Drama3Engine, scenes: dict[int, list[HistoryTurn]], frames: int) -> str:
    """One retake and one take of a written next line (warmed whole first) per history size under
    torch.profiler: the ranges' CPU and CUDA times and the top ops by CPU time, a section each.
    (Stop 40's H100 gave the written line ~25 ms more first audio than the retake, both
    restoring every row: the two side by side show where it goes.)"""
    from contextlib import ExitStack
    from unittest import mock

    from torch.profiler import ProfilerActivity, profile, record_function

    from engine import HistoryTurn

    def ranged(name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with record_function(f"retake: {name}"):
                return method(*args, **kwargs)
        return call

    owners = {"prefix": engine.decoder.prefix, "decoder": engine.decoder}
    sections = []
    for size, turns in scenes.items():
        kept = measure(engine, LINE, turns, 500, frames)  # the slot holds the line's history again, as for a retake
        written = [*turns, HistoryTurn(LINE, kept["codes"])]
        cases = (("retake", LINE, turns), ("next line, written", "And the last line.", written))
        for take, text, history_turns in cases:
            if take != "retake":
                warm_prefix(engine, text, history_turns, True)
            with ExitStack() as stack:
                for owner, name in RANGES:
                    target = owners[owner]
                    stack.enter_context(mock.patch.object(target, name, ranged(name, getattr(target, name))))
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
                with profile(activities=activities) as prof:
                    row = measure(engine, text, history_turns, 501, frames)
            events = prof.key_averages()
            ranges = "\n".join(f"  {e.key:<24} calls {e.count:>4}  cpu {e.cpu_time_total / 1000:8.3f} ms  "
                               f"device {e.device_time_total / 1000:8.3f} ms"
                               for e in events if e.key.startswith("retake:"))
            top = events.table(sort_by="self_cpu_time_total", row_limit=20)
            sections.append(f"# {take}, history {size:,} rows: prompt {row['prompt_rows']:,} rows (built in "
                            f"{row['prompt_ms']} ms, {row['cached_rows']:,} restored), prefill {row['prefill_ms']} ms, "
                            f"first window after {row['first_window_steps']} steps, first audio "
                            f"{row['first_audio_ms']} ms\n{ranges}\n{top}")
    return "\n\n".join(sections) + "\n"


def run(args: argparse.Namespace) -> int:
    import torch

    from engine import EngineSpec, load_engine

    if args.random_weights and args.preset == "full" and args.device != "cuda":
        args.device = "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("retake bench retake: --device cuda but no CUDA GPU is available")
    spec = EngineSpec(checkpoint=args.checkpoint, device=args.device,
                      random_weights=args.preset if args.random_weights else None,
                      prefix_cache_gib=args.prefix_cache_gib, slots=1,
                      kernels=None if args.kernels is None else tuple(args.kernels),
                      compile_prefill=args.compile_prefill)
    engine = load_engine(spec)
    warm = engine.warm_up()
    prefix = engine.decoder.prefix
    if prefix is None:
        raise SystemExit("retake bench retake: the prefix cache is off (--prefix-cache-gib 0); give it a budget")
    rows: list[Row] = []
    held: dict[int, int] = {}
    with torch.inference_mode():
        for size in args.history_rows:
            scene_rows, held[size] = scene(engine, size, args)
            rows += scene_rows
        if args.profile:
            scenes = {size: history(engine, size, args.turn_frames) for size in args.history_rows}
            args.profile.write_text(profile_retakes(engine, scenes, args.frames), encoding="utf-8")
    source = engine.weights + (" (demo weights: its audio is noise)" if engine.demo_weights else "")
    device = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
    print(f"# {device}, {source}; prefix cache budget {prefix.budget / 2**30:.2f} GiB, "
          f"host {prefix.host_budget / 2**30:.2f} GiB; warm-up {warm['warm_up_s']} s")
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))

    def first_audio(size: int, cache: str) -> float | None:
        return next((r["first_audio_ms"] for r in rows
                     if r["history_rows"] == size and r["cache"] == cache and r["take"] == "retake"), None)

    largest, smallest = max(args.history_rows), min(args.history_rows)
    ratios: dict[str, float | None] = {}
    for cache in ("on", "off"):
        top, base = first_audio(largest, cache), first_audio(smallest, cache)
        ratios[cache] = round(top / base, 2) if top and base else None
        print(f"ratio: first audio of a retake with {largest:,} rows of history / with {smallest:,}, cache "
              f"{cache}: {ratios[cache]}x" + (" (target on the H200: <= 1.2x)" if cache == "on" else ""))
    memory = {"row_bytes": prefix.row_bytes, "state_bytes": prefix.state_bytes, "held_bytes": held}
    largest_prompt = max(r["prompt_rows"] for r in rows if r["history_rows"] == largest)
    print(f"memory: {prefix.row_bytes:,} bytes per row (keys and values of {len(prefix.caches)} attention caches), "
          f"{prefix.state_bytes:,} bytes of DeltaNet states per snapshot ({len(prefix.deltanets)} layers); "
          f"a {largest_prompt:,}-row prompt: {largest_prompt * prefix.row_bytes / 2**20:.1f} MiB of rows + "
          f"{prefix.state_bytes / 2**20:.1f} MiB per snapshot; the {largest:,}-row scene held "
          f"{held[largest] / 2**20:.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "source": source, "rows": rows, "ratios": ratios,
                                         "memory": memory, "warm_up": warm}, indent=2, default=str) + "\n",
                             encoding="utf-8")
    return 0

"""`retake bench decode|prefill|takes`: Drama 3 speed, printed as a table and written as JSON.

    retake bench takes --random-weights --preset full --device cuda --json bench.json

- decode: the median decode step (one frame: candidate head, sampling with RAS, the
  13-layer tower, the backbone step) over >= 200 steps after a 300-row prompt, eager and
  replayed from a CUDA graph; and the bytes one step must read over the measured copy
  bandwidth (the floor), with the ratio to it. Then the graphed step of a 64-slot
  decoder (`--slots`) with 1, 2, 4, ... 64 takes decoding (`decode_rows`): the row-bucket
  graphs, so a director alone on a big server pays the 1-row step. Also the aten ops and GEMMs one eager
  step launches (torch.profiler), before and after `fuse_projections`, and the eager
  step time once fused.
- prefill: the prompt's backbone and tower prefill for 300, 1,000 and 4,000 rows, launched
  from Python and replayed from the chunk graphs (prefill.py), beside the targets; then
  2, 4 and 8 prompts of 40, 100 and 255 rows waiting together, prefilled one after another
  and in groups (`prefill_group` rows: prefill_groups.py; 255 rows is longer than every
  group shape: 4 and 8 such prompts run cut to 128 rows), with the ratio.
- takes: all of the above, plus first audio (prefill start to the first PCM window on the
  host) for a 300-row prompt, vocode ms per window length, and peak GPU memory.

One module per part: model (the weights and synthetic prompts), decode (the step and its
floor, the step by decoding rows), profiling (ops per step, kernel tables), prefill, takes
(first audio, vocode); engine/bench/timing.py times them all.

Design choices:
- The parts run in the order of what matters most (decode, the profile, first audio and
  vocode, prefill, the 64-slot step by decoding rows) and the JSON is rewritten after
  each, so a run stopped by a time limit (scripts/gpu) keeps what it measured.
- GPU times come from CUDA events around the region after warm-up; CPU runs print the
  same table (the numbers there are only for comparison within one run).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from engine.bench.drama3.decode import bench_decode, bench_kv, bench_rows
from engine.bench.drama3.model import Row, build
from engine.bench.drama3.prefill import PREFILL_ROWS, bench_prefill, bench_prefill_groups
from engine.bench.drama3.profiling import profile_tables
from engine.bench.drama3.takes import bench_takes
from engine.bench.options import add_device, add_weights
from engine.drama3.fast import DEFAULT_KERNELS, KERNELS
from engine.errors import RequestError

HELP = "Drama 3 speed: decode step eager vs CUDA graph, prefill, first audio (see docs/perf.md)"
TARGETS = {"decode_graph_ms": 4.0, "first_audio_ms": 60.0, "graph_speedup": 3.0}
NOTE = "random weights: routing is near-uniform, so expert reuse across tokens is lower than with real weights"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser, preset=None, checkpoint_help="a Drama 3 checkpoint directory",
                preset_help="model size with --random-weights (full: the assumed 35B-A3B dimensions; default: full "
                            "on a GPU, tiny on a CPU)")
    add_device(parser, auto=False)
    parser.add_argument("--no-compile", action="store_true", help="leave decode layers uncompiled")
    parser.add_argument("--kernels", nargs="*", choices=KERNELS, metavar="NAME", default=None,
                        help=f"the decode step's Triton kernels to install, of {', '.join(KERNELS)} (default: "
                             f"{' '.join(DEFAULT_KERNELS)}; none: --kernels with no name)")
    parser.add_argument("--compile-prefill", action="store_true",
                        help="also compile the layers for prefill chunks (symbolic row count)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="write the top kernels of one decode step and one 300-row prefill here")
    parser.add_argument("--steps", type=int, default=200, help="decode steps timed (median reported)")
    parser.add_argument("--slots", type=int, default=64,
                        help="slots of the decoder whose row-bucket graphs are timed (default 64)")
    parser.add_argument("--prompt-rows", type=int, nargs="+", default=list(PREFILL_ROWS), metavar="N",
                        help="prompt sizes prefilled (default 300 1000 4000); the first is first audio's prompt")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")


def bench_part(name: str, part: Callable[[], list[Row]], device: torch.device) -> list[Row]:
    """One part's rows, or a `skipped` row saying why when the GPU's memory ran out (an 80 GB card
    holds the full preset and a 64-slot decoder, not also what earlier parts left cached), or a
    `failed` row with the error (its traceback on stderr; the run then exits 1): the parts after
    it run (stop 40's H100: a kernel failing at 2 rows ended `bench takes` before its KV part).
    The part's graphs and caches are freed after it either way."""
    try:
        return part()
    except torch.OutOfMemoryError:
        if device.type != "cuda":
            raise
        free, total = torch.cuda.mem_get_info(device)
        print(f"# {name}: skipped, out of GPU memory ({free / 2**30:.1f} of {total / 2**30:.1f} GiB free); "
              "a smaller --slots, or `retake bench prefill` / `decode` apart, needs less", flush=True)
        return [{"bench": "skipped", "part": name, "reason": "out of GPU memory"}]
    except Exception as error:  # noqa: BLE001 - one part's failure is reported; the others still measure
        traceback.print_exc()
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        print(f"# {name}: failed ({reason}); the next parts run", flush=True)
        return [{"bench": "failed", "part": name, "reason": reason}]
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("retake bench: --device cuda but no CUDA GPU is available")
    if args.checkpoint is None and not args.random_weights:
        args.random_weights = True
    if args.preset is None:
        args.preset = "full" if device.type == "cuda" else "tiny"
    if args.random_weights and args.preset == "full" and device.type != "cuda":
        # (its float32 weights took the 24 GiB of a CPU machine until the kernel killed the bench)
        raise RequestError("--random-weights --preset full needs a GPU (--device cuda); use --preset tiny on a CPU")
    started = time.perf_counter()
    rows: list[Row] = []
    meta: dict[str, object] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "torch": torch.__version__, "note": NOTE, "targets": TARGETS}

    def flush() -> None:  # the JSON after each part: a run stopped by a time limit keeps what it measured
        from engine.kernels.fallback import failures

        meta["kernel_fallbacks"] = failures()  # kernels that failed on this GPU: their references ran
        if device.type == "cuda":
            meta["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")

    with torch.inference_mode():
        model, codec, config, source = build(args)
        meta.update(source=source, build_s=round(time.perf_counter() - started, 1))
        # Parts in the order of what matters most if a time limit stops the run early.
        if args.bench in ("decode", "takes"):
            decode_rows, installed = bench_decode(model, config, device, args.steps, not args.no_compile,
                                                  args.compile_prefill, args.kernels)
            rows += decode_rows
        else:
            from engine.drama3.fast import install_fast_path

            installed = install_fast_path(model, compile_layers=not args.no_compile,
                                          compile_prefill=args.compile_prefill,
                                          **({} if args.kernels is None else {"kernels": args.kernels}))
        meta["kernels"] = installed
        flush()
        if args.profile:  # early: a stage's time limit ended three runs on the H200 before it was written
            args.profile.write_text(profile_tables(model, config, device, codec), encoding="utf-8")
        parts: list[tuple[str, Callable[[], list[Row]]]] = []
        if args.bench == "takes":
            parts += [("first audio", lambda: bench_takes(model, codec, config, device, args.prompt_rows[0]))]
        if args.bench in ("prefill", "takes"):
            parts += [("prefill", lambda: bench_prefill(model, config, device, args.prompt_rows)),
                      ("prefill groups", lambda: bench_prefill_groups(model, config, device))]
        if args.bench in ("decode", "takes"):
            parts += [("decode rows", lambda: bench_rows(model, config, device, args.steps, args.slots)),
                      ("decode by KV bucket", lambda: bench_kv(model, config, device, args.steps))]
        for name, part in parts:
            rows += bench_part(name, part, device)
            flush()
    flush()
    print(f"# {meta['device']}, torch {meta['torch']}, {source}; kernels: {', '.join(installed) or 'none'}")
    print(f"# {NOTE}")
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    decode = next((r for r in rows if r["bench"] == "decode"), None)
    if decode:
        print(f"targets: decode graph {decode['graph_ms']} ms (<= {TARGETS['decode_graph_ms']}), "
              f"graph speed-up {decode['graph_speedup']}x (>= {TARGETS['graph_speedup']}x), "
              f"{decode['ratio_to_floor']}x the {decode['floor_ms']} ms floor")
    by_rows = [r for r in rows if r["bench"] == "decode_rows"]
    if by_rows:
        alone = by_rows[0]["graph_ms"]
        print(f"targets: a director alone on {by_rows[0]['slots']} slots {alone} ms per frame "
              f"(<= 1.1x the 1-slot step {decode['graph_ms'] if decode else '?'} ms); with "
              + ", ".join(f"{r['rows']}: {r['graph_ms']} ms" for r in by_rows[1:]))
        print("mixed steps (a prompt's 64 / 256 rows carried by the step, against the step and the chunk apart): "
              + ", ".join(f"{r['rows']} rows {r['mixed_64_ms']} / {r['mixed_256_ms']} ms against "
                          f"{r['apart_64_ms']} / {r['apart_256_ms']}" for r in by_rows))
        if "mixed_8x64_ms" in by_rows[0]:
            print("mixed steps carrying a group (8 prompts x 64 rows / 4 x 128: prompts asking together): "
                  + ", ".join(f"{r['rows']} rows {r['mixed_8x64_ms']} / {r['mixed_4x128_ms']} ms" for r in by_rows))
    prefill = [r for r in rows if r["bench"] == "prefill"]
    if prefill:
        print("targets: prefill " + ", ".join(f"{r['rows']} rows {r['graph_ms']} ms (<= {r['target_ms']}, eager "
                                              f"{r['eager_ms']})" for r in prefill))
    first = [r for r in rows if r["bench"] == "first_audio"]
    if first:
        print("targets: first audio " + ", ".join(f"{r['first_audio_ms']} ms (first window "
                                                 f"{r['first_window_frames']}, {r['vocoder']})" for r in first)
              + f" (<= {TARGETS['first_audio_ms']})")
    if meta.get("peak_memory_gib") is not None:
        print(f"peak GPU memory {meta['peak_memory_gib']} GiB")
    return 1 if any(row["bench"] == "failed" for row in rows) else 0

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
  from Python and replayed from the chunk graphs (prefill.py), beside the targets.
- takes: all of the above, plus first audio (prefill start to the first PCM window on the
  host) for a 300-row prompt, vocode ms per window length, and peak GPU memory.

Design choices:
- Random weights are drawn on the GPU (random_weights.py) in the released dtypes; the
  routing of random weights is near-uniform, which every report says.
- The parts run in the order of what matters most (decode, first audio and vocode,
  prefill, the 64-slot step by decoding rows, the profile) and the JSON is rewritten after
  each, so a run stopped by a time limit (scripts/gpu) keeps what it measured.
- Prompts are synthetic frame rows (text rows, then audio rows): tokenising is not part of
  what is measured; `prompt_ms` is measured by `retake say` instead.
- GPU times come from CUDA events around the region after warm-up; CPU runs print the
  same table (the numbers there are only for comparison within one run).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.drama3.fast import DEFAULT_KERNELS, KERNELS

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from torch.autograd.profiler_util import FunctionEvent

    from engine.drama3.codec import Codec
    from engine.drama3.config import Drama3Config
    from engine.drama3.decoder import Decoder
    from engine.drama3.model import Drama3Model
    from engine.drama3.prompt import Prompt

Row = dict[str, Any]  # one printed and JSON row of a benchmark

HELP = "Drama 3 speed: decode step eager vs CUDA graph, prefill, first audio (see docs/perf.md)"
TARGETS = {"decode_graph_ms": 4.0, "first_audio_ms": 60.0, "graph_speedup": 3.0}
PREFILL_ROWS = (300, 1000, 4000)
PREFILL_TARGETS_MS = {300: 30.0, 1000: 80.0, 4000: 300.0}
WINDOW_FRAMES = (10, 20, 32, 64)
NOTE = "random weights: routing is near-uniform, so expert reuse across tokens is lower than with real weights"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path, help="a Drama 3 checkpoint directory")
    source.add_argument("--random-weights", action="store_true", help="random weights made on the device")
    parser.add_argument("--preset", choices=("full", "tiny"), default="full",
                        help="model size with --random-weights (full: the assumed 35B-A3B dimensions)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
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


# ─── Building ─────────────────────────────────────────────────────────────────


def build(args: argparse.Namespace) -> tuple[Drama3Model, Codec, Drama3Config, str]:
    """(model, codec, config, source) on the device; the fast path is installed later."""
    from engine.drama3.codec import load_codec

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.checkpoint is not None:
        from engine.drama3.checkpoint import load_model

        model, config, _ = load_model(args.checkpoint, device=device, dtype=dtype)
        codec = load_codec(args.checkpoint, device=device)
        source = str(args.checkpoint)
    else:
        from engine.drama3.random_weights import random_parts

        model, config, _, codec = random_parts(args.preset, device, dtype)  # the codec as served: ready()
        source = f"random weights, preset {args.preset}"
    return model, codec, config, source


def synthetic_prompt(config: Drama3Config, rows: int, max_new_tokens: int, seed: int = 0) -> Prompt:
    """A prompt of `rows` frame rows: a third text, then audio rows with random codes."""
    from engine.drama3.prompt import Prompt
    from engine.drama3.sampling import Sampling

    generator = torch.Generator().manual_seed(seed)
    frames = torch.zeros(rows, config.frame_width, dtype=torch.long)
    text = max(2, rows // 3)
    frames[:text, 0] = torch.randint(0, 256, (text,), generator=generator)
    codes = torch.randint(0, 1024, (rows - text, config.num_codebooks), generator=generator)
    codes[:, 0] = torch.randint(1, config.codebook_size, (rows - text,), generator=generator)
    frames[text:, 1:] = codes
    frames[text:, 0] = codes[:, 0] + config.semantic_start_token_id
    sampling = Sampling(temperature=1.0, top_p=0.9, top_k=30, max_new_tokens=max_new_tokens, seed=seed)
    return Prompt(rows=frames, history_used=0, sampling=sampling)


# ─── Timing ───────────────────────────────────────────────────────────────────


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Milliseconds of each call, CUDA events on the GPU, the host clock on the CPU."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
    return times


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    src, dst = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    src.random_(0, 255)
    ms = statistics.median(timed_ms(lambda: dst.copy_(src), device, 20))
    return 2 * n / (ms / 1000)


def decode_step_bytes(model: Drama3Model, kv_rows: int) -> int:
    """The fewest bytes one decode step of one take must read: every weight it multiplies
    (k of E experts per layer), one row of each embedding table, the KV rows it attends
    and the DeltaNet states it reads and writes."""
    config, total = model.config, 0
    text = config.text
    for name, tensor in model.state_dict().items():
        if tensor.dtype == torch.long:
            continue
        size = tensor.numel() * tensor.element_size()
        if "embed_tokens" in name or "codebook_embeddings" in name or name.endswith("embedding.weight"):
            rows = 1 + config.num_codebooks if "codebook_embeddings" in name else 1
            size = size // tensor.shape[0] * rows
        elif ".experts." in name:
            size = size * text.num_experts_per_tok // text.num_experts
        total += size
    kv = len(text.full_attention_layers) * 2 * kv_rows * text.num_key_value_heads * text.head_dim
    kv += (config.tower.n_layer + config.tower.residual_layers) * 2 * kv_rows * config.tower.n_local_heads \
        * config.tower.head_dim
    dtype_bytes = model.candidate_head.element_size()
    state = len(text.linear_attention_layers) * text.linear_num_value_heads * text.linear_key_head_dim \
        * text.linear_value_head_dim * 4 * 2  # float32, read and written
    return int(total + kv * dtype_bytes + state)


# ─── Counting ops ─────────────────────────────────────────────────────────────

# Aten ops that launch no kernel: views, allocations, metadata, and wrappers that compute
# only through the ops they call (a no-op `.to()` calls nothing).
NO_KERNEL = frozenset(f"aten::{name}" for name in (
    "as_strided", "view", "_unsafe_view", "_reshape_alias", "reshape", "t", "transpose", "permute", "expand",
    "expand_as", "slice", "select", "split", "split_with_sizes", "chunk", "unflatten", "flatten", "unsqueeze",
    "squeeze", "narrow", "unbind", "view_as", "alias", "detach", "real", "resolve_conj", "resolve_neg",
    "lift_fresh", "empty", "empty_strided", "empty_like", "resize_", "result_type", "scalar_tensor", "to",
    "type_as", "contiguous"))
GEMMS = frozenset(f"aten::{name}" for name in ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_scaled_mm"))


PARTS = ("deltanet", "attention", "tower")  # profiler ranges around layer calls


def step_op_counts(decoder: Decoder, kv_len: int) -> dict[str, int]:
    """The aten ops one eager `decoder.advance(kv_len)` launches, counted with torch.profiler.

    An op counts if it launches work (not in NO_KERNEL) and no op it calls counts: a
    composite like `linear` counts as its `mm`, and a kernel's own helpers are not counted
    twice. Keys: `ops` (all of them), `gemms` (matrix products), `linears` (F.linear
    calls), and each per part as `{part}_{key}`: `deltanet` and `attention` (the backbone
    layers with that mixer), `tower` (its 13 layers) and `other` (candidate head,
    sampling, embedding, codebook sums, final norm)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from engine.drama3.backbone import DecoderLayer
    from engine.drama3.tower import TowerLayer

    ranges: list[record_function] = []
    hooks = []
    for module in decoder.model.modules():
        if isinstance(module, (DecoderLayer, TowerLayer)):
            part = "tower" if isinstance(module, TowerLayer) else "attention" if module.full_attention else "deltanet"
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, part=part: ranges.append(record_function(part).__enter__())))
            hooks.append(module.register_forward_hook(lambda m, args, out: ranges.pop().__exit__(None, None, None)))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decoder.advance(kv_len)
            sync(decoder.device)
    finally:
        for hook in hooks:
            hook.remove()
    counts: dict[str, int] = {}

    def add(key: str, event: FunctionEvent | None) -> None:
        while event is not None and event.name not in PARTS:
            event = event.cpu_parent
        for name in (key, f"{event.name if event is not None else 'other'}_{key}"):
            counts[name] = counts.get(name, 0) + 1

    def launches(event: FunctionEvent) -> bool:
        """Count `event` or the ops under it; True if anything counted."""
        below = [launches(child) for child in event.cpu_children]  # a list: every child is visited
        if any(below) or not event.name.startswith("aten::") or event.name in NO_KERNEL:
            return any(below)
        add("ops", event)
        if event.name in GEMMS:
            add("gemms", event)
        return True

    for event in prof.events():
        if event.cpu_parent is None:
            launches(event)
        if event.name == "aten::linear":
            add("linears", event)
    return counts


# ─── Benchmarks ───────────────────────────────────────────────────────────────


def bench_decode(model: Drama3Model, config: Drama3Config, device: torch.device, steps: int, compile_layers: bool,
                 compile_prefill: bool = False, kernels: Sequence[str] | None = None) -> tuple[list[Row], list[str]]:
    """Eager steps of the plain model and its op counts, the same with projections fused,
    then the fast path installed: compiled steps and graph replays. Rows: the decode row,
    then one `step_ops` row (ops and GEMMs per part of the step) per model, plain and fused."""
    from engine.drama3.decoder import Decoder
    from engine.drama3.fast import fuse_projections, install_fast_path

    max_rows = 300 + steps + 64
    prompt = synthetic_prompt(config, 300, steps + 32)
    eager = Decoder(model, max_rows)
    eager.prefill(prompt)
    position = 299
    bucket = eager.kv_len(position + steps)
    for _ in range(3):
        eager.advance(bucket)
    eager_ms = timed_ms(lambda: eager.advance(bucket), device, steps)
    row: Row = {"bench": "decode", "kv_rows": bucket, "steps": steps,
           "eager_ms": round(statistics.median(eager_ms), 3)}
    plain_ops = step_op_counts(eager, bucket)
    fuse_projections(model)  # the fast path's first step, measured on its own (install finds it done)
    fused_ops = step_op_counts(eager, bucket)
    row.update(ops_per_step=plain_ops["ops"], gemms_per_step=plain_ops["gemms"],
               fused_ops_per_step=fused_ops["ops"], fused_gemms_per_step=fused_ops["gemms"])
    text = config.text
    layers = {"deltanet": len(text.linear_attention_layers), "attention": len(text.full_attention_layers),
              "tower": config.tower.n_layer + config.tower.residual_layers, "other": None}
    op_rows = [{"bench": "step_ops", "fused": fused, **{f"{part}_layers": n for part, n in layers.items() if n},
                **{f"{part}_{key}": counts.get(f"{part}_{key}", 0) for part in layers for key in ("ops", "gemms")}}
               for fused, counts in ((False, plain_ops), (True, fused_ops))]
    eager.prefill(prompt)  # the steps above used up rows: start the take again
    for _ in range(3):
        eager.advance(bucket)
    row["fused_eager_ms"] = round(statistics.median(timed_ms(lambda: eager.advance(bucket), device, steps)), 3)
    installed = install_fast_path(model, compile_layers=compile_layers, compile_prefill=compile_prefill,
                                  **({} if kernels is None else {"kernels": kernels}))
    installed = ["fused_projections"] + [name for name in installed if name != "fused_projections"]  # also on CPU
    if compile_layers and device.type == "cuda":
        started = time.perf_counter()
        eager.prefill(prompt)
        for _ in range(3):
            eager.advance(bucket)
        row["compile_s"] = round(time.perf_counter() - started, 1)
        row["compiled_ms"] = round(statistics.median(timed_ms(lambda: eager.advance(bucket), device, steps)), 3)
    graphed = Decoder(model, max_rows, graphs=True)  # eager steps on a CPU
    graphed.capture()
    graphed.prefill(prompt)
    positions = iter(range(position, position + 10 * steps))
    for _ in range(3):
        graphed.step(next(positions))
    graph_ms = timed_ms(lambda: graphed.step(next(positions)), device, steps)
    row["graph_ms"] = round(statistics.median(graph_ms), 3)
    row["graph_kv_rows"] = graphed.graph_kv_len(position + steps)
    row["graph_speedup"] = round(row["eager_ms"] / row["graph_ms"], 2)
    row["capture_s"] = round(sum(sum(g.capture_s.values()) for g in graphed.graphs.values()), 1)
    bandwidth = copy_bandwidth(device)
    step_bytes = decode_step_bytes(model, row["graph_kv_rows"])
    row["step_gib"] = round(step_bytes / 2**30, 3)
    row["bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
    row["floor_ms"] = round(step_bytes / bandwidth * 1000, 3)
    row["ratio_to_floor"] = round(row["graph_ms"] / row["floor_ms"], 2)
    row["frames_per_s"] = round(1000 / row["graph_ms"], 1)
    return [row, *op_rows], installed


def bench_rows(model: Drama3Model, config: Drama3Config, device: torch.device, steps: int,
               slots: int = 64) -> list[Row]:
    """The graphed step of a `slots`-slot decoder with 1, 2, 4, ... of its takes decoding
    (the row-bucket graphs): what a director alone, or a few, pay on a server of many slots."""
    from engine.drama3.decoder import Decoder

    prompt_rows, max_rows = 300, 300 + 10 * steps + 64
    decoder = Decoder(model, max_rows, slots, graphs=True)
    decoder.capture(up_to_rows=max_rows)
    for slot in range(slots):
        decoder.prefill(synthetic_prompt(config, prompt_rows, 10 * steps, seed=slot), slot)
    out: list[Row] = []
    position = prompt_rows - 1
    for rows in decoder.row_buckets:
        stepping = list(range(rows))
        for _ in range(3):
            decoder.step(position, stepping)
            position += 1
        positions = iter(range(position, position + steps))
        step = functools.partial(lambda positions, stepping: decoder.step(next(positions), stepping), positions,
                                 stepping)
        ms = statistics.median(timed_ms(step, device, steps))
        position += steps
        out.append({"bench": "decode_rows", "slots": slots, "rows": rows, "graph_ms": round(ms, 3),
                    "frames_per_s": round(rows * 1000 / ms, 1), "graphs": decoder.graphed})
    return out


def bench_prefill(model: Drama3Model, config: Drama3Config, device: torch.device,
                  sizes: list[int] = list(PREFILL_ROWS)) -> list[Row]:  # noqa: B006 - never mutated
    """Each prompt size prefilled launched from Python (chunks of 512 rows) and, on CUDA,
    replayed from the chunk graphs (prefill.py); median of 3 after a warm-up."""
    from engine.drama3.decoder import Decoder

    rows_out = []
    max_rows = max(sizes) + 64
    eager = Decoder(model, max_rows)
    graphed = Decoder(model, max_rows, graphs=True)
    started = time.perf_counter()
    graphed.chunked.capture()
    capture_s = round(time.perf_counter() - started, 1)
    eager_sizes = sorted(size for size, graphs in graphed.chunked.graphs.items() if graphs.eager)
    for rows in sizes:
        prompt = synthetic_prompt(config, rows, 16)
        row: Row = {"bench": "prefill", "rows": rows}
        for name, decoder in (("eager", eager), ("graph", graphed)):
            decoder.prefill(prompt)  # warm-up (autotuning, allocator)
            ms = statistics.median(timed_ms(functools.partial(decoder.prefill, prompt), device, 3))
            row[f"{name}_ms"], row[f"{name}_rows_per_s"] = round(ms, 2), round(rows / ms * 1000)
        row.update(target_ms=PREFILL_TARGETS_MS.get(rows), graphs=graphed.graphed, capture_s=capture_s,
                   eager_chunk_sizes=eager_sizes)
        rows_out.append(row)
    return rows_out


def bench_takes(model: Drama3Model, codec: Codec, config: Drama3Config, device: torch.device,
                prompt_rows: int = 300) -> list[Row]:
    """First audio of a take (its windows vocoded inline, and on a worker thread as the
    engine and the server do), and vocode time per window launched from Python and
    replayed from the window graphs (codec_graphs.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.drama3.codec_graphs import WindowGraphs, decode_window
    from engine.drama3.decoder import Decoder
    from engine.drama3.slots import Slots
    from engine.drama3.stream import STREAM_OVERLAP_FRAMES, Window, window_lengths
    from engine.drama3.take import Done

    out: list[Row] = []
    max_rows = prompt_rows + 200 + 64
    decoder = Decoder(model, max_rows, graphs=True)
    decoder.capture()
    graphs = WindowGraphs(codec, window_lengths(STREAM_OVERLAP_FRAMES, 4))  # covers the seed's windows too
    graphs.capture()
    window_graphs = graphs if graphs.graphs.enabled else None
    vocoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-vocoder")
    for first_window in (None, 4):
        for where, executor in (("inline", None), ("thread", vocoder)):
            firsts: list[float] = []
            slots = Slots(decoder, codec, overlap=STREAM_OVERLAP_FRAMES, first_window=first_window,
                          executor=executor, graphs=window_graphs)
            for seed in range(4):
                prompt = synthetic_prompt(config, prompt_rows, 48, seed)
                done = next(e for e in slots.generate(slots.start(prompt)) if isinstance(e, Done))
                firsts.append(done.timings["first_audio_ms"] or 0.0)
            out.append({"bench": "first_audio", "prompt_rows": prompt_rows, "first_window_frames": first_window or 10,
                        "vocoder": where, "first_audio_ms": round(statistics.median(firsts[1:]), 1)})
    vocoder.shutdown()
    codes = torch.randint(0, 1024, (config.num_codebooks, 512), device=device)
    for frames in WINDOW_FRAMES:
        for context in (0, STREAM_OVERLAP_FRAMES):
            end = context + frames
            window = Window(start=0, emit=context, end=end, last=False)
            row: Row = {"bench": "vocode", "frames": frames, "context_frames": context}
            decode_window(codec, codes, window)
            row["eager_ms"] = round(statistics.median(timed_ms(functools.partial(decode_window, codec, codes, window),
                                                               device, 5)), 2)
            if graphs.runs(window):
                row["graph_frames"] = graphs.graphs.bucket_for(end)  # the graph it replays (padded up)
                row["graph_ms"] = round(statistics.median(timed_ms(functools.partial(graphs.pcm, codes, window),
                                                                   device, 5)), 2)
            out.append(row)
    return out


def profile_tables(model: Drama3Model, config: Drama3Config, device: torch.device) -> str:
    """The kernels of one graphed decode step and one 300-row prefill, most time first."""
    from torch.profiler import ProfilerActivity, profile

    from engine.drama3.decoder import Decoder

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    max_rows = 300 + 64
    prompt = synthetic_prompt(config, 300, 32)
    decoder = Decoder(model, max_rows)  # eager steps: the profiler sees each kernel
    decoder.prefill(prompt)
    bucket = decoder.graph_kv_len(300 + 6)
    decoder.advance(bucket)
    sync(device)
    out = []
    with profile(activities=activities) as step_profile:
        decoder.advance(bucket)
        sync(device)
    out.append("# one decode step (the installed fast path, launched without its graph)\n"
               + step_profile.key_averages().table(sort_by=sort, row_limit=40))
    with profile(activities=activities) as prefill_profile:
        decoder.prefill(prompt)
        sync(device)
    out.append("# one 300-row prefill\n" + prefill_profile.key_averages().table(sort_by=sort, row_limit=40))
    return "\n\n".join(out)


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("retake bench: --device cuda but no CUDA GPU is available")
    if args.checkpoint is None and not args.random_weights:
        args.random_weights, args.preset = True, args.preset
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
        if args.bench == "takes":
            rows += bench_takes(model, codec, config, device, args.prompt_rows[0])
            flush()
        if args.bench in ("prefill", "takes"):
            rows += bench_prefill(model, config, device, args.prompt_rows)
            flush()
        if args.bench in ("decode", "takes"):
            rows += bench_rows(model, config, device, args.steps, args.slots)
            flush()
        if args.profile:
            args.profile.write_text(profile_tables(model, config, device), encoding="utf-8")
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
    return 0

"""The Drama 3 decode step timed: eager, fused, compiled and replayed from its CUDA graph, against
the bytes it must read (the floor); the graphed step of a many-slot decoder by rows decoding;
and the graphed step of one take by KV bucket (what a long history costs every frame).

Design choices:
- The floor is the fewest bytes one step must read (the weights it multiplies, k of E experts
  per layer, the KV rows it attends, the DeltaNet states) over the copy bandwidth measured on
  this device (engine/bench/timing.py); the ratio to it says how far from memory-bound a step is.
- `fuse_projections` is measured on its own before the fast path is installed (its op counts
  and eager time), then `install_fast_path` finds it done.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from engine.bench.drama3.model import Row, synthetic_prompt
from engine.bench.drama3.profiling import chunk_op_counts, step_op_counts
from engine.bench.timing import copy_bandwidth, timed_ms

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.config import Drama3Config
    from engine.drama3.decoder import Decoder
    from engine.drama3.model import Drama3Model
    from engine.drama3.prompt import Prompt

CHUNK_OPS_ROWS = 128  # the prefill chunk whose ops `bench_decode` counts (a short prompt's one chunk)


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


def bench_decode(model: Drama3Model, config: Drama3Config, device: torch.device, steps: int, compile_layers: bool,
                 compile_prefill: bool = False, kernels: Sequence[str] | None = None) -> tuple[list[Row], list[str]]:
    """Eager steps of the plain model and its op counts, the same with projections fused,
    then the fast path installed: compiled steps and graph replays. Rows: the decode row,
    then one `step_ops` row (ops and GEMMs per part of the step) per model, plain and fused,
    and a `chunk_ops` row: the ops of one eager prefill chunk of CHUNK_OPS_ROWS rows by part,
    its norms' apart, and what `prefill_norms` leaves (each norm one launch)."""
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
    chunk = chunk_op_counts(eager, CHUNK_OPS_ROWS)
    op_rows.append({"bench": "chunk_ops", "rows": CHUNK_OPS_ROWS, "ops": chunk["ops"],
                    **{f"{part}_ops": chunk.get(f"{part}_ops", 0) for part in ("deltanet", "attention", "tower",
                                                                               "norm", "other")},
                    "norms": chunk.get("norms", 0),
                    "ops_with_prefill_norms": chunk["ops"] - chunk.get("norm_ops", 0) + chunk.get("norms", 0)})
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
    graphed, row["graph_ms"] = graphed_step(model, prompt, max_rows, position, steps, device)
    if "shared_beside" in installed and device.type == "cuda":  # A/B: the shared experts in line
        from engine.drama3.moe_beside import BESIDE

        BESIDE.on = False
        try:
            row["graph_inline_ms"] = graphed_step(model, prompt, max_rows, position, steps, device)[1]
        finally:
            BESIDE.on = True
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


def graphed_step(model: Drama3Model, prompt: Prompt, max_rows: int, position: int, steps: int,
                 device: torch.device) -> tuple[Decoder, float]:
    """A graphed decoder after `prompt`, and the median ms of its steps from `position` (eager
    steps on a CPU). `bench_decode` runs it with the shared experts beside and in line."""
    from engine.drama3.decoder import Decoder

    graphed = Decoder(model, max_rows, graphs=True, mixed=False)  # one take: nothing to carry
    graphed.capture()
    graphed.prefill(prompt)
    positions = iter(range(position, position + 10 * steps))
    for _ in range(3):
        graphed.step(next(positions))
    return graphed, round(statistics.median(timed_ms(lambda: graphed.step(next(positions)), device, steps)), 3)


def bench_rows(model: Drama3Model, config: Drama3Config, device: torch.device, steps: int,
               slots: int = 64) -> list[Row]:
    """The graphed step of a `slots`-slot decoder with 1, 2, 4, ... of its takes decoding
    (the row-bucket graphs): what a director alone, or a few, pay on a server of many slots.
    Beside each, a step carrying a prompt's chunk of 64 and 256 rows (mixed.py) against the
    step and that chunk's own graph one after the other (`mixed_<rows>_ms`, `apart_<rows>_ms`;
    the last slot holds the chunk, so the last bucket steps one row fewer), and a step carrying
    a group of prompts' chunks in each group shape (`mixed_8x64_ms`: mixed.py `step_group`)."""
    from engine.drama3.decoder import ROW_BUCKETS, Decoder
    from engine.drama3.mixed import MIXED_ROWS
    from engine.drama3.prefill_groups import GROUP_SHAPES, PREFILL_GROUP
    from engine.readback import to_device

    mixed_steps = min(steps, 30)
    prompt_rows = 300
    new_rows = 10 * steps + (2 * len(MIXED_ROWS) + len(GROUP_SHAPES)) * (mixed_steps + 3) * len(ROW_BUCKETS)
    max_rows = prompt_rows + new_rows + 64
    decoder = Decoder(model, max_rows, slots, graphs=True, mixed=True, group=PREFILL_GROUP,
                      mixed_group=True)  # (groups: on a CPU too)
    decoder.capture(up_to_rows=max_rows)
    for slot in range(slots - 1):
        decoder.prefill(synthetic_prompt(config, prompt_rows, new_rows, seed=slot), slot)
    chunk = decoder.chunked.begin(to_device(synthetic_prompt(config, max(MIXED_ROWS), 1, seed=slots).rows, device),
                                  slots - 1)
    out: list[Row] = []
    position = prompt_rows - 1

    def timed(call: Callable[[int], object], count: int) -> float:
        nonlocal position
        for _ in range(3):
            call(position)
            position += 1
        positions = iter(range(position, position + count))
        ms = statistics.median(timed_ms(lambda: call(next(positions)), device, count))
        position += count
        return round(ms, 3)

    def mixed(stepping: list[int], size: int, at: int) -> None:  # the step carrying the loaded chunk
        feeds = decoder.mixed.feeds[size]
        decoder.step(at, stepping, feeds, feeds[decoder.row_bucket(len(stepping))].bucket_for(max(size, at + 2)))

    def mixed_group(stepping: list[int], shape: tuple[int, int], at: int) -> None:  # carrying the loaded group
        feeds = decoder.mixed.group_feeds[shape]
        decoder.step(at, stepping, feeds, feeds[decoder.row_bucket(len(stepping))].bucket_for(max(shape[1], at + 2)))

    def apart(stepping: list[int], size: int, at: int) -> None:  # the step, then the chunk's own graph
        decoder.step(at, stepping)
        decoder.chunked.chunk(chunk, 0, size)

    for rows in decoder.row_buckets:
        stepping = list(range(min(rows, slots - 1)))
        row: Row = {"bench": "decode_rows", "slots": slots, "rows": rows, "graphs": decoder.graphed}
        row["graph_ms"] = timed(functools.partial(decoder.step, rows=stepping), steps)
        row["frames_per_s"] = round(rows * 1000 / row["graph_ms"], 1)
        for size in MIXED_ROWS:
            decoder.chunked.load(chunk, 0, size, size)
            row[f"mixed_{size}_ms"] = timed(functools.partial(mixed, stepping, size), mixed_steps)
            row[f"apart_{size}_ms"] = timed(functools.partial(apart, stepping, size), mixed_steps)
        for shape in decoder.mixed.shapes:  # (every prompt of the group in the chunk's slot: the same work)
            decoder.groups.load([chunk] * shape[0], [(0, shape[1])] * shape[0], shape)
            row[f"mixed_{shape[0]}x{shape[1]}_ms"] = timed(functools.partial(mixed_group, stepping, shape), mixed_steps)
        out.append(row)
    return out


def bench_kv(model: Drama3Model, config: Drama3Config, device: torch.device, steps: int,
             max_rows: int = 8192) -> list[Row]:
    """The graphed step of one take at each KV bucket up to `max_rows`: a retake with 4,000 rows
    of history steps at the bucket past them (its attention reads every row of it, masked past
    its position), where a take with none steps at 512; with `cache_attention` (one bucket)
    the step at that position, reading its own rows. Beside each: its floor."""
    from engine.drama3.decoder import Decoder, graph_kv_buckets

    decoder = Decoder(model, min(max_rows, config.text.max_position_embeddings), graphs=True, mixed=False)
    decoder.capture()
    decoder.prefill(synthetic_prompt(config, 300, steps + 32))
    bandwidth = copy_bandwidth(device)
    out: list[Row] = []
    for bucket in graph_kv_buckets(decoder.max_rows):  # (with `cache_attention` on, all in the decoder's one)
        position = bucket - 2  # the furthest position whose step attends this bucket
        for _ in range(3):
            decoder.step(position)
        ms = statistics.median(timed_ms(functools.partial(decoder.step, position), device, steps))
        floor_ms = decode_step_bytes(model, bucket) / bandwidth * 1000
        out.append({"bench": "decode_kv", "kv_rows": bucket, "graph_ms": round(ms, 3),
                    "floor_ms": round(floor_ms, 3), "graphs": decoder.graphed})
    return out

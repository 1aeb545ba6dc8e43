"""`retake bench kernels`: each decode-step kernel against its torch reference, on a GPU.

    retake bench kernels [--rows 1 8 64] [--json FILE]

For each kernel (engine/kernels/) at the full preset's decode shapes and each batch of
`--rows` decoding takes: the median time of one call of the Triton kernel and of its
torch reference, the bytes one call must move, the floor (those bytes over the measured
device copy bandwidth), the kernel's ratio to it, and how many calls one decode step
makes (so `step_ms` is the kernel's share of a step). Kernels: the sampler's main-token
draw (4,097 candidates with RAS) and one codebook head's (4,096), the residual add +
RMSNorm of a 2,048-wide row, one Gated DeltaNet layer's step, one MoE layer's routing
(softmax, top 8 of 256, renormalised), and one layer's FP8 experts (256 x 2,048 x 512,
top 8; the default layout, one block per pair without split-K as the kernel ran before,
and the by-expert layout), and one full-attention layer's one-row attention over 512 and
4,096 rows of history per take (cache_attention, against the model's gather and SDPA); each
dense weight of a step at up to 16 rows (dense_rows against F.linear: dense_cases.py); and
PersonaPlex's attention over a full float8 ring of 3,000 positions per conversation (`rows`
conversations; `per_step` and `step_ms` then count one tick's 32 Helium layers).

Design choices:
- A call's time is the replay of a CUDA graph of at least MIN_CALLS calls divided by their
  number, median of 20 replays: graphs remove the launch overhead a decode step no longer
  pays, and every call reads its own copy of the data a step reads cold from memory
  (DeltaNet states, the experts chosen by a fresh routing), at least 128 MiB in all, so the
  L2 cache does not flatter them (`copies`; calls past them reuse them in turn). A graph of
  one call timed the replay's own ~15 us: stop 31's small kernels (routing, norm,
  samplers) all read 13-18 us. Activations and logits are one copy: in a step they are
  fresh from the previous kernel. References with a host sync (the MoE reference) run
  eagerly, timed with CUDA events around the same calls (`reference_mode` says which).
- The shapes come from the `full` preset's config (engine/drama3/config.py), not from
  constants here; `cases` takes any config, and the tests run it at a small one.
- Random inputs (never zeros); routing is uniform random, as with random weights.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from engine.bench.cases import Case, copies_for
from engine.drama3.config import Drama3Config

HELP = ("each decode kernel (sampler, norm, DeltaNet step, MoE routing and layout, FP8 MoE, cache attention, "
        "dense rows, PersonaPlex's ring attention) vs its torch reference (needs CUDA)")
MIN_CALLS = 32  # calls per timed graph: the replay's fixed cost spread thin
REPLAYS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64],
                        help="decoding takes per call (default 1 8 64)")
    parser.add_argument("--only", nargs="+", metavar="PREFIX",
                        help="time only the cases whose name starts with one of these (e.g. 'personaplex ring')")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")


# ─── cases ───────────────────────────────────────────────────────────────────


def sampler_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    from engine.drama3.model import candidate_ids
    from engine.drama3.sampler import SamplingTensors
    from engine.kernels import sampler

    width = config.codebook_size + 1
    logits = (torch.randn(rows, width, device=device) * 2).bfloat16().float()  # [B, 4097]
    head_logits = logits[:, 1:].contiguous()  # [B, 4096]
    ids = candidate_ids(config).to(device)
    start = config.semantic_start_token_id
    window = torch.randint(start, start + config.codebook_size, (rows, 16), device=device)
    settings = SamplingTensors(torch.ones(rows, device=device), torch.full((rows,), 30, device=device),
                               torch.full((rows,), 0.9, device=device))
    seed = torch.randint(0, 2**62, (rows,), device=device)
    counter = torch.randint(0, 1000, (rows,), device=device)
    finite = torch.ones(rows, dtype=torch.bool, device=device)
    main_args = (logits, ids, window, settings, seed, counter, start, config.codebook_size, finite)
    code_args = (head_logits, settings, seed, counter, 3, finite)
    main_bytes = logits.numel() * 4 + ids.numel() * 8 + window.numel() * 8 + rows * 8 * 6
    code_bytes = head_logits.numel() * 4 + rows * 8 * 6
    return [
        Case("sample_main", rows, 1, main_bytes, 1, lambda i: sampler.sample_main_kernel(*main_args),
             lambda i: sampler.sample_main_reference(*main_args)),
        Case("sample_code", rows, config.tower.residual_layers, code_bytes, 1,
             lambda i: sampler.sample_code_kernel(*code_args), lambda i: sampler.sample_code_reference(*code_args)),
    ]


def norm_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    from engine.kernels import norm

    D, eps = config.text.hidden_size, config.text.rms_norm_eps
    x, update = (torch.randn(rows, D, device=device).bfloat16() for _ in range(2))
    weight = (torch.randn(D, device=device) * 0.1).bfloat16()
    per_step = 2 * config.text.num_hidden_layers + 2 * (config.tower.n_layer + config.tower.residual_layers)
    return [Case("add_rms_norm", rows, per_step, 4 * rows * D * 2 + D * 2, 1,
                 lambda i: norm.add_rms_norm_kernel(x, update, weight, eps),
                 lambda i: norm.add_rms_norm_reference(x, update, weight, eps))]


def deltanet_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    from engine.drama3.deltanet import GatedDeltaNet
    from engine.kernels import deltanet_step as ds

    text = config.text
    with torch.device("meta"):
        layer = GatedDeltaNet(text)
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        delattr(layer, name)  # the step reads none of the projections: do not allocate them
    layer = layer.to_empty(device=device).to(torch.bfloat16)
    with torch.no_grad():
        layer.conv1d.weight.normal_(0.0, 0.5)
        layer.norm.weight.uniform_(0.5, 1.5)
    layer.A_log.data = torch.rand(text.linear_num_value_heads, device=device).log()
    layer.dt_bias.data = torch.randn(text.linear_num_value_heads, device=device) * 0.5
    layer.setup_cache(rows, device, torch.bfloat16)
    state_bytes = layer.recurrent_state.numel() * 4 + layer.conv_state.numel() * 2  # per copy, all rows
    copies = copies_for(state_bytes)
    states = [(torch.randn_like(layer.conv_state), torch.randn_like(layer.recurrent_state) * 0.3)
              for _ in range(copies)]
    twin = copy.copy(layer)  # the reference's own states, so the two never share a buffer
    twin._buffers = dict(layer._buffers)
    twin_states = [(c.clone(), s.clone()) for c, s in states]
    widths = (layer.conv_channels, layer.v_heads * layer.v_dim, layer.v_heads, layer.v_heads)
    packed = torch.randn(rows, sum(widths), device=device).bfloat16()  # one fused projection's output
    ends = [sum(widths[:i + 1]) for i in range(len(widths))]
    mixed, z, b, a = (packed[:, end - width:end] for end, width in zip(ends, widths))
    positions = torch.randint(1, 500, (rows,), device=device)
    slots = torch.arange(rows, device=device)

    def run(target: GatedDeltaNet, pairs: list[tuple[torch.Tensor, torch.Tensor]], i: int,
            step: Callable[..., torch.Tensor]) -> torch.Tensor:
        target.conv_state, target.recurrent_state = pairs[i]  # copy i's states, cold in memory
        return step(ds.step_layer(target), mixed, z, b, a, positions, slots)

    per_row = 2 * (text.linear_num_value_heads * text.linear_key_head_dim * text.linear_value_head_dim * 4
                   + layer.conv_channels * (text.linear_conv_kernel_dim - 1) * 2) \
        + (sum(widths) + layer.v_heads * layer.v_dim) * 2
    weights = layer.conv1d.weight.numel() * 2 + layer.v_dim * 2 + 2 * layer.v_heads * 4
    return [Case("deltanet_step", rows, len(text.linear_attention_layers), rows * per_row + weights, copies,
                 lambda i: run(layer, states, i, ds.deltanet_step_kernel),
                 lambda i: run(twin, twin_states, i, ds.deltanet_step_reference))]


def moe_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    from engine.drama3.fp8 import FP8, quantize_fp8
    from engine.kernels import fp8_moe as m

    text = config.text
    E, D, inter, k = text.num_experts, text.hidden_size, text.moe_intermediate_size, text.num_experts_per_tok
    w13 = torch.empty(E, 2 * inter, D, dtype=FP8, device=device)
    s13 = torch.empty(E, 2 * inter // 128, D // 128, device=device)
    w2 = torch.empty(E, D, inter, dtype=FP8, device=device)
    s2 = torch.empty(E, D // 128, inter // 128, device=device)
    for first in range(0, E, 16):  # quantise in chunks: the float32 draw of all experts is large
        chunk = slice(first, min(E, first + 16))
        w13[chunk], s13[chunk] = quantize_fp8(torch.randn(w13[chunk].shape, device=device) * D**-0.5)
        w2[chunk], s2[chunk] = quantize_fp8(torch.randn(w2[chunk].shape, device=device) * inter**-0.5)
    expert_bytes = (w13[0].numel() + w2[0].numel()) + (s13[0].numel() + s2[0].numel()) * 4
    copies = copies_for(rows * k * expert_bytes)
    routings = []
    for _ in range(copies):
        weights, ids = torch.rand(rows, E, device=device).softmax(-1).topk(k)
        routings.append((ids, weights / weights.sum(-1, keepdim=True)))
    x = torch.randn(rows, D, device=device).bfloat16()
    unique = statistics.mean(len(set(ids.flatten().tolist())) for ids, _ in routings)
    moved = int(unique * expert_bytes) + 2 * rows * D * 2 + rows * k * 12

    def call(layout: str | None = None, split_k: int | None = None) -> Callable[[int], torch.Tensor]:
        return lambda i: m.fp8_moe(x, w13, s13, w2, s2, *routings[i], layout=layout, split_k=split_k)

    reference = lambda i: m.moe_reference(x, w13, s13, w2, s2, *routings[i])
    layers = text.num_hidden_layers
    return [
        Case("fp8_moe", rows, layers, moved, copies, call(), reference, reference_graphs=False),
        Case("fp8_moe pairs split 1", rows, layers, moved, copies, call(layout="pairs", split_k=1), reference,
             reference_graphs=False),
        Case("fp8_moe experts", rows, layers, moved, copies, call(layout="experts"), reference,
             reference_graphs=False),
    ]


def routing_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    from engine.kernels import moe_routing

    text = config.text
    E, k = text.num_experts, text.num_experts_per_tok
    packed = torch.randn(rows, E + 1, device=device).bfloat16()  # the router + shared-expert gate GEMM's output
    logits = packed[:, :E]  # [B, E], a view as in the step
    return [Case("moe_routing", rows, text.num_hidden_layers, rows * (E * 2 + k * 12), 1,
                 lambda i: moe_routing.route_kernel(logits, k), lambda i: moe_routing.route_reference(logits, k)),
            layout_case(config, rows, device)]


def layout_case(config: Drama3Config, rows: int, device: torch.device) -> Case:
    """The FP8 experts' "experts" layout of `rows` tokens' pairs (a many-take step, a prefill
    chunk): the one-launch kernel against fp8_moe.pairs_by_expert's ~12 torch launches."""
    from engine.kernels import fp8_moe
    from engine.kernels.expert_layout import expert_layout, max_blocks

    text = config.text
    E, k = text.num_experts, text.num_experts_per_tok
    ids = torch.rand(rows, E, device=device).topk(k).indices
    block_m = 16 if rows <= 64 else 64
    slots = max_blocks(rows * k, E, block_m) * (block_m + 1) * 4
    return Case("expert_layout", rows, text.num_hidden_layers, rows * k * 8 + slots, 1,
                lambda i: expert_layout(ids, E, block_m), lambda i: fp8_moe.pairs_by_expert(ids, E, block_m))


ATTENTION_KV_ROWS = (512, 4096)  # each take's rows of history: a short scene, a retake's long one


def attention_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    """One full-attention layer's one-row attention, every take at `kv` rows: the kernel over the
    slot cache, against the model's path (the slots' rows of the KV bucket gathered, SDPA with
    its mask), at the KV bucket those rows step in."""
    text = config.text
    return [attention_case(config, rows, kv, device) for kv in ATTENTION_KV_ROWS if kv <= text.max_position_embeddings]


def attention_case(config: Drama3Config, rows: int, kv: int, device: torch.device) -> Case:
    from engine.drama3.layers import attend
    from engine.kernels import cache_attention

    text = config.text
    H, Hkv, Dh = text.num_attention_heads, text.num_key_value_heads, text.head_dim
    moved = rows * kv * Hkv * Dh * 2 * 2  # keys and values, bfloat16
    copies = copies_for(moved)
    caches = [tuple(torch.randn(rows, kv + 1, Hkv, Dh, device=device).bfloat16() for _ in range(2))
              for _ in range(copies)]
    q = torch.randn(rows, H, Dh, device=device).bfloat16()
    slots = torch.arange(rows, device=device)
    positions = torch.full((rows,), kv - 1, device=device)

    def call(i: int) -> torch.Tensor:
        keys, values = caches[i]
        return cache_attention.cache_attention_kernel(q, keys, values, slots, positions)

    def reference(i: int) -> torch.Tensor:
        keys, values = caches[i]
        return attend(q[:, None], keys[slots, :kv], values[slots, :kv], positions[:, None])[:, 0]

    return Case(f"cache_attention kv {kv}", rows, len(text.full_attention_layers), moved, copies, call, reference)


# (ring slots per step, warps, tensor cores): the kernel's own, then others to compare (the
# tensor-core form, slower on the H200 at 1 / 8 / 64 conversations, among them)
RING_SHAPES = ((64, 2, False), (64, 4, False), (128, 2, False), (128, 4, False), (64, 1, False), (32, 4, True))


def ring_cases(rows: int, device: torch.device, lm: dict[str, int] | None = None) -> list[Case]:
    """The ring kernel as it runs (`personaplex ring`) and with other block shapes or on the
    tensor cores (`personaplex ring block B warps W[ tensor cores]`), on the same rings."""
    return [ring_case(rows, device, lm, block, warps, dots) for block, warps, dots in RING_SHAPES]


def ring_case(rows: int, device: torch.device, lm: dict[str, int] | None = None, block: int = 64,
              warps: int = 2, dots: bool = False) -> Case:
    """PersonaPlex's one-query attention over a full float8 ring (engine/kernels/ring_attention.py)
    for `rows` conversations, each a whole context in: one of Helium's layers per tick, released
    sizes unless `lm` gives others (dim, num_heads, context)."""
    from engine.kernels import ring_attention
    from engine.personaplex.config import RELEASED_LM
    from engine.personaplex.ring import quantize_kv

    sizes = {key: int(RELEASED_LM[key]) for key in ("dim", "num_heads", "context", "num_layers")} | (lm or {})
    H, C = sizes["num_heads"], sizes["context"]
    Dh = sizes["dim"] // H
    moved = rows * H * C * (Dh + 4) * 2  # float8 keys and values with a float32 scale each
    copies = copies_for(moved)
    rings = [(*quantize_kv(torch.randn(rows, H, C, Dh, device=device)), *quantize_kv(torch.randn(rows, H, C, Dh,
                                                                                                   device=device)))
             for _ in range(copies)]  # (keys, key scales, values, value scales) per copy
    q = torch.randn(rows, H, Dh, device=device).bfloat16()
    positions = torch.full((rows,), 10 * C + 7, device=device)  # wrapped many times: every slot visible

    def call(i: int) -> torch.Tensor:
        keys, key_scales, values, value_scales = rings[i]
        return ring_attention.ring_attention_kernel(q, keys, values, key_scales, value_scales, positions, C,
                                                    block=block, warps=warps, dots=dots)

    def reference(i: int) -> torch.Tensor:
        keys, key_scales, values, value_scales = rings[i]
        return ring_attention.ring_attention_reference(q, keys, values, key_scales, value_scales, positions, C)

    name = "personaplex ring" + ("" if (block, warps, dots) == RING_SHAPES[0] else
                                 f" block {block} warps {warps}" + (" tensor cores" if dots else ""))
    return Case(name, rows, sizes["num_layers"], moved, copies, call, reference)


def cases(config: Drama3Config, rows: int, device: torch.device, lm: dict[str, int] | None = None) -> list[Case]:
    """Every kernel's case at one batch of `rows` decoding takes (conversations, for the ring: of
    PersonaPlex's released sizes, or `lm`'s). The dense layers' and the ring's first (a stage's
    time limit ends the bench where it is; `--only` picks cases by name)."""
    from engine.bench.dense_cases import dense_cases

    return [*dense_cases(config, rows, device), *ring_cases(rows, device, lm),
            *attention_cases(config, rows, device), *sampler_cases(config, rows, device),
            *norm_cases(config, rows, device), *deltanet_cases(config, rows, device),
            *routing_cases(config, rows, device), *moe_cases(config, rows, device)]


# ─── timing ──────────────────────────────────────────────────────────────────


def _replay_ms(run: Callable[[], object]) -> float:
    times: list[float] = []
    for _ in range(REPLAYS + 2):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def call_ms(call: Callable[[int], object], copies: int, graphs: bool) -> float:
    """Median ms of one call: a CUDA graph of at least MIN_CALLS calls over the `copies`
    replayed, or the copies' calls eagerly."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up (compiles the kernels) off the capture
        for i in range(copies):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    count = copies if not graphs else max(copies, MIN_CALLS)

    def calls() -> None:
        for i in range(count):
            call(i % copies)

    if not graphs:
        return _replay_ms(calls) / count
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    ms = _replay_ms(graph.replay) / count
    del graph
    return ms


def measure(case: Case, bandwidth: float) -> dict[str, object]:
    kernel_ms = call_ms(case.call, case.copies, graphs=True)
    reference_ms = call_ms(case.reference, case.copies, graphs=case.reference_graphs)
    floor_ms = case.bytes / bandwidth * 1000
    return {"kernel": case.kernel, "rows": case.rows, "kernel_ms": round(kernel_ms, 4),
            "reference_ms": round(reference_ms, 4), "reference_mode": "graph" if case.reference_graphs else "eager",
            "speedup": round(reference_ms / kernel_ms, 2), "mb": round(case.bytes / 1e6, 3),
            "floor_ms": round(floor_ms, 4), "ratio_to_floor": round(kernel_ms / floor_ms, 1),
            "per_step": case.per_step, "step_ms": round(kernel_ms * case.per_step, 3), "copies": case.copies}


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("retake bench kernels: needs a CUDA GPU (the kernels are Triton's); none is available",
              file=sys.stderr)
        return 2
    import triton

    from engine.bench.timing import copy_bandwidth
    from engine.drama3.config import preset

    device = torch.device("cuda")
    config = Drama3Config.from_dict(preset("full"))
    bandwidth = copy_bandwidth(device)
    meta = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__,
            "bandwidth_gb_s": round(bandwidth / 1e9, 1), "preset": "full", "replays": REPLAYS}
    print(f"# {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
          f"copy bandwidth {meta['bandwidth_gb_s']} GB/s; preset full, random inputs")
    header = ("kernel", "rows", "kernel_ms", "reference_ms", "reference_mode", "speedup", "mb", "floor_ms",
              "ratio_to_floor", "per_step", "step_ms")
    print("  ".join(f"{name:>14}" if name != "kernel" else f"{name:<22}" for name in header))
    results = []
    with torch.inference_mode():
        for rows in args.rows:
            for case in cases(config, rows, device):
                if args.only and not case.kernel.startswith(tuple(args.only)):
                    continue
                row = measure(case, bandwidth)
                results.append(row)
                print("  ".join(f"{row[name]!s:>14}" if name != "kernel" else f"{row[name]!s:<22}"
                                for name in header), flush=True)
                del case
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": results}, indent=2) + "\n", encoding="utf-8")
    return 0

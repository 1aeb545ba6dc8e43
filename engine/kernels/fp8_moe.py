"""Block-FP8 W8A8 mixture-of-experts GEMM: a Triton kernel beside its torch reference.

Drama 3 ships its routed experts as float8_e4m3fn weights with one float32 scale per
128x128 block (`weight_scale_inv`, quant method "bsgemm-moe"). On the GPU the experts
run as released: activations are quantised per token and per group of 128 channels to
float8 (dynamic scale = amax / 448), and the kernel multiplies float8 tiles on the
tensor cores, applying the activation scale per row and the weight scale per block.

Design choices:
- One grouped-GEMM kernel serves both GEMMs of the expert MLP (gate/up, then down).
  Rows are (token, choice) pairs grouped into blocks of BLOCK_M rows of one expert; a
  block reads its expert's weights once.
- Two block layouts, both free of host syncs (static shapes: capturable in a CUDA graph,
  and no graph break under torch.compile). "pairs" gives every pair its own block,
  computed inside the kernel from the routing itself: no layout ops at all, right for a
  few tokens (decode: one token's 8 experts are distinct, so nothing is shared to
  group). "experts" sorts pairs by expert and pads each expert's group to BLOCK_M, into
  a static bound of blocks (P / BLOCK_M + min(E, P)); blocks past the real ones have
  expert -1 and exit at once. That reads each routed expert once however many tokens
  chose it (many decoding takes, prefill).
- Split-K for few blocks: when a GEMM has fewer programs than ~2 per SM (decode at
  batch 1: 8 pairs), each block's K range is split over more programs, which write
  float32 partial sums; the next kernel adds them in a fixed order (deterministic,
  no atomics), so a seeded take stays reproducible.
- The expert MLP is five launches ("pairs" layout; the unfused path had ~13):
  activation quantisation, gate/up GEMM, one kernel for "sum the partials, SiLU(gate) *
  up, round to the model dtype, quantise per 128 channels", down GEMM (scaled by the
  routing weights), and one that sums each token's pairs and partials and rounds.
- Tried and dropped (stop 36, measured on an H100 with `retake bench kernels`): a form for a
  few tokens in three launches (the gate/up GEMM quantising its own activation tiles, the
  down GEMM summing each token's 8 experts itself, no combine): 0.0254 ms a layer at one
  row against this one's 0.0208, 0.0962 against 0.0778 at eight (its down GEMM of 16-column
  blocks took 14 us where this one's takes ~5 and the combine ~2).
- BLOCK_K is the quantisation group (128) so every K step has exactly one activation
  scale per row and one weight scale per tile; BLOCK_N divides 128 for the same reason.
- `moe_reference` is the plain-torch definition (dequantise, matmul in float32); tests
  compare the kernel to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.drama3.fp8 import FP8, FP8_MAX, dequantize_fp8
from engine.kernels.expert_layout import expert_layout, max_blocks
from engine.kernels.fallback import guarded

try:
    import triton
    import triton.language as tl

    from engine.kernels.casts import round_to
except ImportError:  # CPU installs have no Triton; only the reference path runs there
    triton = None
    tl = None

GROUP = 128  # activation quantisation group = the weight block width
DECODE_PAIRS = 64  # up to this many (token, choice) pairs a call gives each pair its own block
TARGET_PROGRAMS = 264  # split K until a GEMM launches about this many programs (2 per H200 SM)
LAYOUTS = ("pairs", "experts")


# ─── torch reference ─────────────────────────────────────────────────────────


def quantize_groups_reference(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (float8 [T, K], float32 scales [T, K/group]) with scale = amax / 448."""
    T, K = x.shape
    groups = x.float().view(T, K // group, group)  # [T, G, group]
    scale = groups.abs().amax(-1).clamp(min=1e-10) / FP8_MAX  # [T, G]
    q = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(T, K), scale


def moe_reference(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor,
                  s2: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  quantize_activations: bool = True) -> torch.Tensor:
    """The expert MLP sum_j w_j * down_e(silu(gate_e x) * up_e x) over each token's choices.

    x [T, D]; w13 float8 [E, 2I, D] (gate rows then up rows), s13 [E, 2I/128, D/128];
    w2 float8 [E, D, I], s2 [E, D/128, I/128]; topk_ids / topk_weights [T, k].
    With quantize_activations the activations take the kernel's float8 round trip
    (rounded to x's dtype first, as the kernel does), so the result matches the kernel to
    float32 accumulation order.
    """
    inter = w2.shape[-1]

    def fake_quant(a: torch.Tensor) -> torch.Tensor:
        if not quantize_activations:
            return a.float()
        q, s = quantize_groups_reference(a)
        return (q.float().view(a.shape[0], -1, GROUP) * s[..., None]).view(a.shape)

    xq = fake_quant(x)  # [T, D]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in sorted(set(topk_ids.flatten().tolist())):
        token, choice = (topk_ids == e).nonzero(as_tuple=True)
        h = xq[token] @ dequantize_fp8(w13[e], s13[e]).T  # [n, 2I]
        a = fake_quant((F.silu(h[:, :inter]) * h[:, inter:]).to(x.dtype))  # [n, I]
        y = a @ dequantize_fp8(w2[e], s2[e]).T  # [n, D]
        out.index_add_(0, token, y * topk_weights[token, choice, None].float())
    return out.to(x.dtype)


# ─── block layouts ───────────────────────────────────────────────────────────


def pairs_one_per_block(topk_ids: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (token, choice) pair in its own block: the "pairs" layout, which the kernel
    computes itself when given no rows (`moe_gemm(rows=None)`); spelled out here as its
    definition. Returns rows [P * block_m] (pair index in slot 0, the sentinel P
    elsewhere) and experts [P] (the expert of each block)."""
    P = topk_ids.numel()
    rows = torch.full((P, block_m), P, dtype=torch.int32, device=topk_ids.device)
    rows[:, 0] = torch.arange(P, dtype=torch.int32, device=topk_ids.device)
    return rows.view(-1), topk_ids.reshape(-1).to(torch.int32)


def pairs_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert, each expert's group padded to a multiple of block_m, with no
    host sync: rows [max_blocks * block_m] (pair index, or the sentinel P) and experts
    [max_blocks] (each block's expert; -1 past the used blocks)."""
    flat = topk_ids.reshape(-1)  # [P]
    P, device = flat.numel(), flat.device
    blocks_total = max_blocks(P, num_experts, block_m)
    order = torch.argsort(flat, stable=True)  # pair indices grouped by expert
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m  # [E]
    block_end = torch.cumsum(blocks, 0)  # [E]
    sorted_experts = flat[order]
    rank = torch.arange(P, device=device) - (torch.cumsum(counts, 0) - counts)[sorted_experts]
    rows = torch.full((blocks_total * block_m,), P, dtype=torch.int32, device=device)
    rows[(block_end - blocks)[sorted_experts] * block_m + rank] = order.to(torch.int32)
    experts = torch.searchsorted(block_end, torch.arange(blocks_total, device=device), right=True)  # [blocks]
    return rows, torch.where(experts < num_experts, experts, -1).to(torch.int32)


# ─── Triton ──────────────────────────────────────────────────────────────────

if triton is not None:

    @triton.jit
    def _quantize_groups_kernel(x_ptr, q_ptr, s_ptr, K: tl.constexpr, GROUP_SIZE: tl.constexpr):
        row = tl.program_id(0)
        g = tl.program_id(1)
        offs = g * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
        x = tl.load(x_ptr + row * K + offs).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x)), 1e-10) / 448.0
        q = tl.clamp(x / scale, -448.0, 448.0)
        tl.store(q_ptr + row * K + offs, q.to(q_ptr.dtype.element_ty))
        tl.store(s_ptr + row * (K // GROUP_SIZE) + g, scale)

    @triton.jit
    def _moe_gemm_kernel(
        a_ptr, a_scale_ptr,  # float8 [M_a, K], float32 [M_a, K/128]
        b_ptr, b_scale_ptr,  # float8 [E, N, K], float32 [E, N/128, K/128]
        c_ptr,  # float32 [SPLIT_K, P, N]: one partial sum per K split
        rows_ptr, experts_ptr, weights_ptr,  # int32 [blocks*BLOCK_M] (unused if ONE_PAIR), [blocks], float32 [P]
        P, N: tl.constexpr, K: tl.constexpr, A_ROW_DIV: tl.constexpr, MUL_WEIGHTS: tl.constexpr,
        ONE_PAIR: tl.constexpr, SPLIT_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        expert = tl.load(experts_ptr + pid_m).to(tl.int64)  # ONE_PAIR: the routing of pair pid_m itself
        if expert < 0:
            return  # a block past the used ones (static bound of the "experts" layout)
        slot = tl.arange(0, BLOCK_M)
        if ONE_PAIR:
            rows = tl.where(slot == 0, pid_m, P)  # the pair in slot 0, the sentinel elsewhere
        else:
            rows = tl.load(rows_ptr + pid_m * BLOCK_M + slot)  # pair index per row
        valid = rows < P
        a_rows = rows // A_ROW_DIV  # first GEMM reads the token; second reads the pair
        K_STEPS: tl.constexpr = K // BLOCK_K // SPLIT_K
        k_first = pid_k * K_STEPS
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = k_first * BLOCK_K + tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None].to(tl.int64) * K + offs_k[None, :]
        b_ptrs = b_ptr + expert * N * K + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
        a_scale_ptrs = a_scale_ptr + a_rows.to(tl.int64) * (K // BLOCK_K) + k_first
        b_scale_ptrs = (b_scale_ptr + expert * (N // 128) * (K // BLOCK_K) + (pid_n * BLOCK_N // 128) * (K // BLOCK_K)
                        + k_first)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, K_STEPS):
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            b = tl.load(b_ptrs)
            a_s = tl.load(a_scale_ptrs + kb, mask=valid, other=0.0)
            b_s = tl.load(b_scale_ptrs + kb)
            acc += tl.dot(a, b) * a_s[:, None] * b_s
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        if MUL_WEIGHTS:
            w = tl.load(weights_ptr + rows, mask=valid, other=0.0)
            acc = acc * w[:, None]
        c_ptrs = c_ptr + pid_k.to(tl.int64) * P * N + rows[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(c_ptrs, acc, mask=valid[:, None])

    @triton.jit
    def _silu_mul_quantize_kernel(
        h_ptr,  # float32 [SPLIT_K, P, 2I]: gate columns, then up columns
        q_ptr, s_ptr,  # float8 [P, I], float32 [P, I/128]
        P, INTER: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_SIZE: tl.constexpr, ACT_DTYPE: tl.constexpr,
    ):
        pair = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)
        offs = g * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
        gate = tl.zeros((GROUP_SIZE,), dtype=tl.float32)
        up = tl.zeros((GROUP_SIZE,), dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):
            row = h_ptr + (split * P + pair) * (2 * INTER)
            gate += tl.load(row + offs)
            up += tl.load(row + INTER + offs)
        act = round_to(gate / (1.0 + tl.exp(-gate)) * up, ACT_DTYPE).to(tl.float32)  # as `.to(x.dtype)`
        scale = tl.maximum(tl.max(tl.abs(act)), 1e-10) / 448.0
        q = tl.clamp(act / scale, -448.0, 448.0)
        tl.store(q_ptr + pair * INTER + offs, q.to(q_ptr.dtype.element_ty))
        tl.store(s_ptr + pair * (INTER // GROUP_SIZE) + g, scale)

    @triton.jit
    def _combine_kernel(
        y_ptr,  # float32 [SPLIT_K, P, D]
        out_ptr,  # [T, D]
        P, D: tl.constexpr, TOPK: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < D
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for choice in tl.static_range(TOPK):
            for split in tl.static_range(SPLIT_K):
                total += tl.load(y_ptr + (split * P + token * TOPK + choice) * D + offs, mask=inside, other=0.0)
        tl.store(out_ptr + token * D + offs, round_to(total, out_ptr.dtype.element_ty), mask=inside)


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton per-token-group float8 quantisation; same contract as the reference."""
    T, K = x.shape
    assert K % GROUP == 0 and x.is_contiguous()
    q = torch.empty(T, K, dtype=FP8, device=x.device)
    s = torch.empty(T, K // GROUP, dtype=torch.float32, device=x.device)
    _quantize_groups_kernel[(T, K // GROUP)](x, q, s, K=K, GROUP_SIZE=GROUP)
    return q, s


def split_for(tiles: int, k_steps: int) -> int:
    """How many ways to split K so that `tiles` output tiles make about TARGET_PROGRAMS programs."""
    split = 1
    while tiles * split * 2 <= TARGET_PROGRAMS and k_steps % (split * 2) == 0:
        split *= 2
    return split


def moe_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
             rows: torch.Tensor | None, experts: torch.Tensor, pairs: int, a_row_div: int,
             weights: torch.Tensor | None, block_m: int, split_k: int | None = None,
             block_n: int = 128) -> torch.Tensor:
    """Partial sums c[s, pair] = (a[pair // a_row_div] @ b[expert(pair)].T)[K split s] * weights[pair]:
    float32 [split_k, P, N]. rows None: one block per pair, experts = each pair's expert [P]."""
    _, N, K = b.shape
    assert K % GROUP == 0 and N % 128 == 0 and 128 % block_n == 0
    assert a.dtype == FP8 and b.dtype == FP8 and a.is_contiguous() and b.is_contiguous() and experts.is_contiguous()
    blocks, k_steps = experts.numel(), K // GROUP
    split = split_k or split_for(blocks * (N // block_n), k_steps)
    assert k_steps % split == 0, f"split_k={split} must divide the {k_steps} K steps"
    c = torch.empty(split, pairs, N, dtype=torch.float32, device=a.device)
    _moe_gemm_kernel[(blocks, N // block_n, split)](
        a, a_scale, b, b_scale, c, rows if rows is not None else experts, experts,
        weights if weights is not None else a_scale,
        pairs, N=N, K=K, A_ROW_DIV=a_row_div, MUL_WEIGHTS=weights is not None, ONE_PAIR=rows is None,
        SPLIT_K=split, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=GROUP, num_warps=4, num_stages=4,
    )
    return c


def silu_mul_quantize(h: torch.Tensor, act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial gate/up sums h [S, P, 2I] -> the quantised activation: float8 [P, I], scales [P, I/128]."""
    S, P, two_inter = h.shape
    inter = two_inter // 2
    q = torch.empty(P, inter, dtype=FP8, device=h.device)
    s = torch.empty(P, inter // GROUP, dtype=torch.float32, device=h.device)
    _silu_mul_quantize_kernel[(P, inter // GROUP)](h, q, s, P, INTER=inter, SPLIT_K=S, GROUP_SIZE=GROUP,
                                                   ACT_DTYPE=_TL_DTYPES[act_dtype])
    return q, s


def combine(y: torch.Tensor, tokens: int, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """Partial down sums y [S, P, D] -> each token's sum over its choices [T, D] in dtype."""
    S, P, D = y.shape
    out = torch.empty(tokens, D, dtype=dtype, device=y.device)
    block = min(1024, triton.next_power_of_2(D))
    _combine_kernel[(tokens, triton.cdiv(D, block))](y, out, P, D=D, TOPK=top_k, SPLIT_K=S, BLOCK=block)
    return out


def fp8_moe(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
            topk_ids: torch.Tensor, topk_weights: torch.Tensor, *, layout: str | None = None,
            split_k: int | None = None) -> torch.Tensor:
    """The expert MLP of `moe_reference` with float8 tensor-core GEMMs. x [T, D] -> [T, D].

    layout "pairs" or "experts" (default: "pairs" up to DECODE_PAIRS pairs); split_k
    (default: by size) splits both GEMMs' K. No host sync either way."""
    T, k = topk_ids.shape
    P = T * k
    layout = layout or ("pairs" if P <= DECODE_PAIRS else "experts")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    rows: torch.Tensor | None
    if layout == "pairs":
        block_m, rows, experts = 16, None, topk_ids.reshape(-1).contiguous()
    else:
        block_m = 16 if T <= 64 else 64
        # two launches for torch's ~12 (argsort among them), at any count
        rows, experts = guarded("expert layout", expert_layout, pairs_by_expert, topk_ids, w13.shape[0], block_m)
    xq, xs = quantize_groups(x.contiguous())
    h = moe_gemm(xq, xs, w13, s13, rows, experts, P, k, None, block_m, split_k)  # [S, P, 2I]
    aq, a_scale = silu_mul_quantize(h, x.dtype)  # [P, I]
    y = moe_gemm(aq, a_scale, w2, s2, rows, experts, P, 1, topk_weights.reshape(-1).float(), block_m,
                 split_k)  # [S, P, D]
    return combine(y, T, k, x.dtype)


_TL_DTYPES = {} if tl is None else {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16,
                                    torch.float16: tl.float16}

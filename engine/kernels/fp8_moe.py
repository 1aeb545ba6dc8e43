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
- Two ways to build those blocks. `pairs_by_expert` sorts pairs by expert and pads each
  expert's group to BLOCK_M (prefill: many tokens share an expert). `pairs_one_per_block`
  gives every pair its own block with no sort and static shapes, so it can be captured
  in a CUDA graph (decode: a handful of tokens, one expert's weights read per pair; the
  step is memory-bound, so the idle rows of the tile cost nothing that matters).
- BLOCK_K is the quantisation group (128) so every K step has exactly one activation
  scale per row and one weight scale per tile; BLOCK_N divides 128 for the same reason.
- `moe_reference` is the plain-torch definition (dequantise, matmul in float32); tests
  compare the kernel to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.drama3.fp8 import FP8, FP8_MAX, dequantize_fp8

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the reference path runs there
    triton = None
    tl = None

GROUP = 128  # activation quantisation group = the weight block width


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
    With quantize_activations the activations take the kernel's float8 round trip, so
    the result matches the kernel to float32 accumulation order.
    """
    T, k = topk_ids.shape
    I = w2.shape[-1]

    def fake_quant(a: torch.Tensor) -> torch.Tensor:
        if not quantize_activations:
            return a.float()
        q, s = quantize_groups_reference(a)
        return (q.float().view(a.shape[0], -1, GROUP) * s[..., None]).view(a.shape)

    xq = fake_quant(x)  # [T, D]
    out = torch.zeros(T, w2.shape[1], dtype=torch.float32, device=x.device)
    for e in topk_ids.unique().tolist():
        token, choice = (topk_ids == e).nonzero(as_tuple=True)
        h = xq[token] @ dequantize_fp8(w13[e], s13[e]).T  # [n, 2I]
        a = fake_quant(F.silu(h[:, :I]) * h[:, I:])  # [n, I]
        y = a @ dequantize_fp8(w2[e], s2[e]).T  # [n, D]
        out.index_add_(0, token, y * topk_weights[token, choice, None].float())
    return out.to(x.dtype)


# ─── block layouts ───────────────────────────────────────────────────────────


def pairs_one_per_block(topk_ids: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (token, choice) pair in its own block: static shapes, no host sync.

    Returns rows [P * block_m] (pair index in slot 0, the sentinel P elsewhere) and
    experts [P] (the expert of each block)."""
    P = topk_ids.numel()
    rows = torch.full((P, block_m), P, dtype=torch.int32, device=topk_ids.device)
    rows[:, 0] = torch.arange(P, dtype=torch.int32, device=topk_ids.device)
    return rows.view(-1), topk_ids.reshape(-1).to(torch.int32)


def pairs_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert, each expert's group padded to a multiple of block_m."""
    flat = topk_ids.reshape(-1)
    P = flat.numel()
    order = torch.argsort(flat, stable=True).to(torch.int32)  # pair indices grouped by expert
    counts = torch.bincount(flat, minlength=num_experts)  # [E]
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded  # [E]
    total = int(padded.sum())
    rows = torch.full((total,), P, dtype=torch.int32, device=flat.device)
    sorted_experts = flat[order.long()]
    rank = torch.arange(P, device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_experts]
    rows[(starts[sorted_experts] + rank).long()] = order
    experts = torch.repeat_interleave(torch.arange(num_experts, device=flat.device, dtype=torch.int32),
                                      (padded // block_m))
    return rows, experts


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
        c_ptr,  # [P, N]
        rows_ptr, experts_ptr, weights_ptr,  # int32 [blocks*BLOCK_M], int32 [blocks], float32 [P]
        P, N: tl.constexpr, K: tl.constexpr, A_ROW_DIV: tl.constexpr,
        MUL_WEIGHTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rows = tl.load(rows_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # pair index per row
        valid = rows < P
        a_rows = rows // A_ROW_DIV  # first GEMM reads the token; second reads the pair
        expert = tl.load(experts_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None].to(tl.int64) * K + offs_k[None, :]
        b_ptrs = b_ptr + expert * N * K + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
        a_scale_ptrs = a_scale_ptr + a_rows.to(tl.int64) * (K // BLOCK_K)
        b_scale_ptrs = b_scale_ptr + expert * (N // 128) * (K // BLOCK_K) + (pid_n * BLOCK_N // 128) * (K // BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, K // BLOCK_K):
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
        c_ptrs = c_ptr + rows[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None])


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton per-token-group float8 quantisation; same contract as the reference."""
    T, K = x.shape
    assert K % GROUP == 0 and x.is_contiguous()
    q = torch.empty(T, K, dtype=FP8, device=x.device)
    s = torch.empty(T, K // GROUP, dtype=torch.float32, device=x.device)
    _quantize_groups_kernel[(T, K // GROUP)](x, q, s, K=K, GROUP_SIZE=GROUP)
    return q, s


def moe_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
             rows: torch.Tensor, experts: torch.Tensor, pairs: int, a_row_div: int,
             weights: torch.Tensor | None, out_dtype: torch.dtype, block_m: int, block_n: int = 128) -> torch.Tensor:
    """c[pair] = (a[pair // a_row_div] @ b[expert(pair)].T) * weights[pair], for all pairs."""
    E, N, K = b.shape
    assert K % GROUP == 0 and N % 128 == 0 and 128 % block_n == 0
    assert a.dtype == FP8 and b.dtype == FP8 and a.is_contiguous() and b.is_contiguous()
    c = torch.empty(pairs, N, dtype=out_dtype, device=a.device)
    grid = (experts.numel(), N // block_n)
    _moe_gemm_kernel[grid](
        a, a_scale, b, b_scale, c, rows, experts, weights if weights is not None else a_scale,
        pairs, N=N, K=K, A_ROW_DIV=a_row_div, MUL_WEIGHTS=weights is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=GROUP, num_warps=4, num_stages=4,
    )
    return c


def fp8_moe(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
            topk_ids: torch.Tensor, topk_weights: torch.Tensor, *, graph_safe: bool | None = None) -> torch.Tensor:
    """The expert MLP of `moe_reference` with float8 tensor-core GEMMs. x [T, D] -> [T, D].

    graph_safe (default: few tokens) builds one block per pair with no host sync, so
    the call can be captured in a CUDA graph."""
    T, k = topk_ids.shape
    P = T * k
    I = w2.shape[-1]
    if graph_safe is None:
        graph_safe = P <= 64
    block_m = 16 if graph_safe else 64
    if graph_safe:
        rows, experts = pairs_one_per_block(topk_ids, block_m)
    else:
        rows, experts = pairs_by_expert(topk_ids, w13.shape[0], block_m)
    xq, xs = quantize_groups(x.contiguous())
    h = moe_gemm(xq, xs, w13, s13, rows, experts, P, k, None, torch.float32, block_m)  # [P, 2I]
    act = (F.silu(h[:, :I]) * h[:, I:]).to(x.dtype)  # [P, I]
    aq, as_ = quantize_groups(act.contiguous())
    y = moe_gemm(aq, as_, w2, s2, rows, experts, P, 1, topk_weights.reshape(-1).float(), torch.float32, block_m)
    return y.view(T, k, -1).sum(1).to(x.dtype)  # [T, D]

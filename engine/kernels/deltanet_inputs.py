"""The delta rule's inputs of a prefill chunk in one Triton launch per Gated DeltaNet layer.

    q, k, v, g, beta = deltanet_inputs_kernel(mixed, b, a, valid, A_log, dt_bias, k_heads, k_dim)

From the causal conv's output mixed [B, T, C] (q | k | v channels, after SiLU) and the gates'
projections b, a [B, T, Hv], it makes what GatedDeltaNet.rule_inputs (the definition) makes:

    q, k = l2norm(q) / sqrt(Dk), l2norm(k)     # per key head, each serving Hv / Hk value heads
    beta = sigmoid(b);  g = -exp(A_log) softplus(a + dt_bias)    # both 0 on padded rows

Design choices:
- Eager torch spends ~35 launches a layer on these (casts, the norms' squares, sums and
  scales, the heads' repeat, the gates, the padding mask), each a few microseconds inside a
  prefill chunk's CUDA graph however few its rows. One program per (row, value head) does
  them all: its key head's q and k (recomputed for each value head it serves: 2 x Dk values),
  its value columns, its two gates.
- q, k and v come out in bfloat16, where the layer gives float32 that the chunked rule
  (flash-linear-attention's, fast.py `fla_delta_rule`) rounds to bfloat16 first thing: the same
  numbers reach the rule, so this kernel is installed only with that rule. g and beta stay
  float32 (the rule takes g in float32 and rounds beta itself).
- Padded rows (at or past `valid[b]`) get beta = g = 0, as the layer's mask: no write, no decay.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    from engine.kernels.casts import round_to
    from engine.kernels.deltanet_step import _softplus
except ImportError:  # CPU installs have no Triton
    triton = None
    tl = None

L2_EPS = 1e-6  # deltanet.l2_normalize's

if triton is not None:

    @triton.jit
    def _deltanet_inputs_kernel(
        mixed_ptr, b_ptr, a_ptr,  # [BT, C], [BT, Hv], [BT, Hv] (row strides below)
        stride_mixed, stride_b, stride_a,
        a_log_ptr, dt_bias_ptr, valid_ptr,  # [Hv], [Hv], int64 [B] (or any pointer when not HAS_VALID)
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # bf16 [BT, Hv, Dk] x 2, [BT, Hv, Dv]; float32 [BT, Hv] x 2
        T, scale,
        HK: tl.constexpr, REPEAT: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
        BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, HAS_VALID: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        value_head = tl.program_id(1)
        head = value_head // REPEAT
        HV: tl.constexpr = HK * REPEAT
        source = mixed_ptr + row * stride_mixed
        dk = tl.arange(0, BLOCK_K)
        inside_k = dk < DK
        q = tl.load(source + head * DK + dk, mask=inside_k, other=0.0).to(tl.float32)
        k = tl.load(source + HK * DK + head * DK + dk, mask=inside_k, other=0.0).to(tl.float32)
        q = q * tl.math.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
        k = k * tl.math.rsqrt(tl.sum(k * k, 0) + 1e-6)
        out = (row * HV + value_head) * DK
        tl.store(q_ptr + out + dk, round_to(q, q_ptr.dtype.element_ty), mask=inside_k)
        tl.store(k_ptr + out + dk, round_to(k, k_ptr.dtype.element_ty), mask=inside_k)
        dv = tl.arange(0, BLOCK_V)
        inside_v = dv < DV
        v = tl.load(source + 2 * HK * DK + value_head * DV + dv, mask=inside_v, other=0.0).to(tl.float32)
        tl.store(v_ptr + (row * HV + value_head) * DV + dv, round_to(v, v_ptr.dtype.element_ty), mask=inside_v)
        beta = tl.sigmoid(tl.load(b_ptr + row * stride_b + value_head).to(tl.float32))
        x = tl.load(a_ptr + row * stride_a + value_head).to(tl.float32) + tl.load(dt_bias_ptr + value_head).to(
            tl.float32)
        g = -tl.exp(tl.load(a_log_ptr + value_head).to(tl.float32)) * _softplus(x)
        if HAS_VALID:  # padded rows write nothing and decay nothing
            real = (row % T) < tl.load(valid_ptr + row // T)
            beta = tl.where(real, beta, 0.0)
            g = tl.where(real, g, 0.0)
        tl.store(beta_ptr + row * HV + value_head, beta)
        tl.store(g_ptr + row * HV + value_head, g)


def deltanet_inputs_kernel(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, valid: torch.Tensor | None,
                           A_log: torch.Tensor, dt_bias: torch.Tensor, k_heads: int,
                           k_dim: int) -> tuple[torch.Tensor, ...]:
    """mixed [B, T, C], b, a [B, T, Hv], valid [B] or None -> q, k [B, T, Hv, Dk] and v [B, T, Hv, Dv]
    in bfloat16, g and beta [B, T, Hv] in float32 (GatedDeltaNet.rule_inputs, for a bfloat16 rule)."""
    B, T, C = mixed.shape
    v_heads = b.shape[-1]
    v_dim = (C - 2 * k_heads * k_dim) // v_heads
    rows = [t.reshape(B * T, t.shape[-1]) for t in (mixed, b, a)]  # views where the rows are one stride apart
    mixed_rows, b_rows, a_rows = (t if t.stride(-1) == 1 else t.contiguous() for t in rows)
    device, half = mixed.device, torch.bfloat16
    q = torch.empty(B, T, v_heads, k_dim, dtype=half, device=device)
    k = torch.empty_like(q)
    v = torch.empty(B, T, v_heads, v_dim, dtype=half, device=device)
    g = torch.empty(B, T, v_heads, dtype=torch.float32, device=device)
    beta = torch.empty_like(g)
    if B * T:
        _deltanet_inputs_kernel[(B * T, v_heads)](
            mixed_rows, b_rows, a_rows, mixed_rows.stride(0), b_rows.stride(0), a_rows.stride(0),
            A_log, dt_bias, valid if valid is not None else A_log, q, k, v, g, beta, T, k_dim ** -0.5,
            HK=k_heads, REPEAT=v_heads // k_heads, DK=k_dim, DV=v_dim, BLOCK_K=triton.next_power_of_2(k_dim),
            BLOCK_V=triton.next_power_of_2(v_dim), HAS_VALID=valid is not None, num_warps=1,
        )
    return q, k, v, g, beta

"""RMSNorm fused with the residual add before it and the cast after it: one pass per row.

    normed, summed = add_rms_norm(x, update, weight, eps)   # summed = x + update; normed = norm(summed)
    normed = rms_norm(x, weight, eps)                       # no residual
    normed = gated_rms_norm_kernel(x, z, weight, eps)       # DeltaNet's: norm(x) * w * silu(z), in z's dtype
    q = rotated_rms_norm_kernel(q, weight, eps, rope, interleaved)   # an attention layer's q/k norm, then rope

Both equal Drama 3's layers (layers.py RMSNorm): the residual add rounds to the model
dtype as `x + h` does, the norm runs in float32, `x * rsqrt(mean(x^2) + eps) * (1 + w)`
(zero-centred, every norm of the backbone and the tower) or `* w` (`zero_centred=False`),
then casts to `out_dtype` (default: x's). Rows are the last dim; any leading shape.

Design choices:
- One program per row holds the whole row in registers (2,048 columns for the backbone
  and tower, 256 for per-head q/k norms): the row is read once and both results written
  once, where eager torch reads and writes it five times (add, cast, square-mean, scale,
  cast) and the compiled layers still split the add from the norm across a GEMM.
- The rounding of the sum to the model dtype happens before the norm reads it, exactly
  as in the unfused layer, so the two agree to float32 rounding of the mean.
- The gated form (deltanet.py's GatedRMSNorm: a plain weight and a SiLU gate z, rounded to
  z's dtype) is the same pass with the gate read beside the row.
- The rotated form (layers.py `RMSNorm.rotated`: a q or k head's norm, then its rope) is a
  program per (row, head): the head's Dh values normed and rounded as the norm rounds, then
  each rotary dim combined with its partner (the other half, or the other of its pair), read
  a second time and normed again (the row's scale is one number), and rounded once more, as
  the unfused rope rounds. It reads q and k where the projection left them (a head's stride
  is its own, the gates' columns between q's heads).
- `rms_norm_reference` / `add_rms_norm_reference` (and deltanet.py's `gated_rms_norm`) are
  the plain-torch definitions (the model's own arithmetic); tests hold the kernel to them.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    from engine.kernels.casts import round_to
except ImportError:  # CPU installs have no Triton; only the references run there
    triton = None
    tl = None


# ─── torch reference ─────────────────────────────────────────────────────────


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, *, zero_centred: bool = True,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., D], weight [D] -> [..., D] in out_dtype (default x's)."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    scale = 1.0 + weight.float() if zero_centred else weight.float()
    return (y * scale).to(out_dtype or x.dtype)


def add_rms_norm_reference(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float, *,
                           zero_centred: bool = True,
                           out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + update), x + update); x, update [..., D] of one dtype."""
    summed = x + update
    return rms_norm_reference(summed, weight, eps, zero_centred=zero_centred, out_dtype=out_dtype), summed


# ─── Triton ──────────────────────────────────────────────────────────────────

if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, update_ptr, weight_ptr,  # [N, D] (row stride given), [N, D] (the update, or the gate z), [D]
        normed_ptr, summed_ptr,  # [N, D] contiguous each
        stride_x, stride_update, eps,
        D: tl.constexpr, BLOCK: tl.constexpr, HAS_UPDATE: tl.constexpr, ZERO_CENTRED: tl.constexpr,
        GATED: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        column = tl.arange(0, BLOCK)
        inside = column < D
        x = tl.load(x_ptr + row * stride_x + column, mask=inside, other=0.0)
        if HAS_UPDATE:
            update = tl.load(update_ptr + row * stride_update + column, mask=inside, other=0.0)
            x = round_to(x.to(tl.float32) + update.to(tl.float32), summed_ptr.dtype.element_ty)  # as `x + h` rounds
            tl.store(summed_ptr + row * D + column, x, mask=inside)
        y = x.to(tl.float32)
        mean_square = tl.sum(y * y, 0) / D
        y = y * tl.math.rsqrt(mean_square + eps)
        weight = tl.load(weight_ptr + column, mask=inside, other=0.0).to(tl.float32)
        scale = 1.0 + weight if ZERO_CENTRED else weight
        y = y * scale
        if GATED:  # weight * y * silu(z), z read as float32
            z = tl.load(update_ptr + row * stride_update + column, mask=inside, other=0.0).to(tl.float32)
            y = y * (z / (1.0 + tl.exp(-z)))
        tl.store(normed_ptr + row * D + column, round_to(y, normed_ptr.dtype.element_ty), mask=inside)


if triton is not None:

    @triton.jit
    def _rotated_rms_norm_kernel(
        x_ptr, weight_ptr, rope_ptr, out_ptr,  # x [BT, H, Dh] (strides below), [Dh], float32 [BT, 2, HALF], [BT, H, Dh]
        stride_row, stride_head, eps,
        H: tl.constexpr, DH: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        base = x_ptr + row * stride_row + head * stride_head
        d = tl.arange(0, BLOCK)
        inside = d < DH
        x = tl.load(base + d, mask=inside, other=0.0).to(tl.float32)
        scale = tl.math.rsqrt(tl.sum(x * x, 0) / DH + eps)
        dtype = out_ptr.dtype.element_ty
        normed = round_to(x * scale * (1.0 + tl.load(weight_ptr + d, mask=inside, other=0.0).to(tl.float32)),
                          dtype).to(tl.float32)  # as the norm's `type_as`
        rotary = d < 2 * HALF
        if INTERLEAVED:  # pairs (2j, 2j+1): even' = even cos - odd sin, odd' = odd cos + even sin
            partner = d ^ 1
            j = d // 2
            sign = tl.where(d % 2 == 0, -1.0, 1.0)
        else:  # halves: first' = first cos - second sin, second' = second cos + first sin
            partner = tl.where(d < HALF, d + HALF, d - HALF)
            j = d % HALF
            sign = tl.where(d < HALF, -1.0, 1.0)
        other = tl.load(base + partner, mask=rotary, other=0.0).to(tl.float32)
        other = round_to(other * scale * (1.0 + tl.load(weight_ptr + partner, mask=rotary, other=0.0).to(tl.float32)),
                         dtype).to(tl.float32)
        cos = tl.load(rope_ptr + row * 2 * HALF + j, mask=rotary, other=1.0)
        sin = tl.load(rope_ptr + row * 2 * HALF + HALF + j, mask=rotary, other=0.0)
        out = tl.where(rotary, normed * cos + sign * (other * sin), normed)
        tl.store(out_ptr + (row * H + head) * DH + d, round_to(out, dtype), mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as [N, D] rows without a copy when it can (the last dim must be dense)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch(x: torch.Tensor, update: torch.Tensor | None, weight: torch.Tensor, eps: float, zero_centred: bool,
            out_dtype: torch.dtype | None, gate: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    D = x.shape[-1]
    rows = _rows(x)
    second = update if update is not None else gate  # the kernel reads either beside the row
    updates = _rows(second) if second is not None else rows
    N = rows.shape[0]
    normed = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device) if update is not None else normed
    block = triton.next_power_of_2(D)
    _add_rms_norm_kernel[(N,)](
        rows, updates, weight, normed, summed, rows.stride(0), updates.stride(0), eps,
        D=D, BLOCK=block, HAS_UPDATE=update is not None, ZERO_CENTRED=zero_centred, GATED=gate is not None,
        num_warps=max(1, min(16, block // 256)),
    )
    return normed, summed


def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, *, zero_centred: bool = True,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`rms_norm_reference` as one Triton launch (one program per row)."""
    return _launch(x, None, weight, eps, zero_centred, out_dtype)[0]


def add_rms_norm_kernel(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float, *,
                        zero_centred: bool = True,
                        out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_rms_norm_reference` as one Triton launch (one program per row)."""
    assert x.shape == update.shape and x.dtype == update.dtype
    return _launch(x, update, weight, eps, zero_centred, out_dtype)


def gated_rms_norm_kernel(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """deltanet.py's `gated_rms_norm` (x [..., D] any float dtype, z [..., D]) as one Triton launch."""
    assert x.shape == z.shape
    return _launch(x, None, weight, eps, False, z.dtype, gate=z)[0]


def rotated_rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, rope: torch.Tensor,
                            interleaved: bool) -> torch.Tensor:
    """layers.py's `RMSNorm.rotated` (x [B, T, H, Dh], rope float32 [B, T, 2, rot/2]) as one
    Triton launch: a program per (row, head)."""
    B, T, H, DH = x.shape
    half = rope.shape[-1]
    if x.stride(-1) != 1 or (B > 1 and x.stride(0) != T * x.stride(1)):  # rows (b, t) one stride apart, heads another
        x = x.contiguous()
    rope = rope.float().contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rotated_rms_norm_kernel[(B * T, H)](
        x, weight, rope, out, x.stride(1), x.stride(2), eps, H=H, DH=DH, HALF=half,
        BLOCK=triton.next_power_of_2(DH), INTERLEAVED=interleaved, num_warps=max(1, min(4, DH // 128)),
    )
    return out


def rotated_rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, rope: torch.Tensor,
                               interleaved: bool) -> torch.Tensor:
    """The model's own arithmetic (layers.py's norm, then its rope), for the kernel's fallback and tests."""
    from engine.drama3.layers import rope_interleaved, rope_neox

    return (rope_interleaved if interleaved else rope_neox)(rms_norm_reference(x, weight, eps), rope)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, zero_centred: bool = True,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The kernel on CUDA, the reference elsewhere."""
    run = rms_norm_kernel if x.is_cuda and triton is not None else rms_norm_reference
    return run(x, weight, eps, zero_centred=zero_centred, out_dtype=out_dtype)


def add_rms_norm(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 zero_centred: bool = True,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + update), x + update): the kernel on CUDA, the reference elsewhere."""
    run = add_rms_norm_kernel if x.is_cuda and triton is not None else add_rms_norm_reference
    return run(x, update, weight, eps, zero_centred=zero_centred, out_dtype=out_dtype)

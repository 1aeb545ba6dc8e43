"""The codec decoder's Snake activation in one pass: x + sin^2(alpha x) / alpha, per channel.

    y = snake_kernel(x, alpha, inverse)   # x [B, C, T] (float16 in the GPU's decoder), alpha [1, C, 1] float32,
                                          # inverse = snake_inverse(alpha) [C], kept by the layer
    y = snake_reference(x, alpha)         # the codec layer's own arithmetic (codec_layers.py Snake)

Design choices:
- Why: eager torch runs a Snake as eight kernels over the whole activation (the float32
  copy, the product, sin, the square, the scale, the add, the cast back), each reading and
  writing it: at a long window's decoder (29 Snakes, up to 96 x 151,552 values each) that
  is ~56 bytes a value moved where one pass moves 4, and at a short window ~230 of its ~930
  launches. SGLang Omni's float16 decoder runs a Triton kernel for it too. Fused, a long
  window's graph took 9.36 ms on an H100 against 14.62 (stop 37, docs/perf.md).
- The arithmetic is the reference's, in its order, in float32: `x + r * s * s` with
  s = sin(alpha x) (tl.sin: libdevice's accurate sinf, not sin.approx) and r = 1 / (alpha + 1e-9)
  computed by torch once, when the layer is fused (`snake_inverse`: C values), so the kernel
  divides nothing and a call launches nothing else; one rounding to x's dtype at the end
  (casts.py `round_to`).
- A program per (row of the batch's channels, block of steps): alpha is one number per row.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    from engine.kernels.casts import round_to
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None

BLOCK = 1024  # steps a program


def snake_reference(x: torch.Tensor, alpha: torch.Tensor, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, C, T], alpha [1, C, 1] -> [B, C, T] in x's dtype, computed in float32 (`inverse`,
    the kernel's, is not read: the reference defines it)."""
    x32, alpha = x.float(), alpha.float()
    return (x32 + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x32).pow(2)).to(x.dtype)


def snake_inverse(alpha: torch.Tensor) -> torch.Tensor:
    """The kernel's per-channel 1 / (alpha + 1e-9), [C] float32, as the reference computes it."""
    return (alpha.float().reshape(-1) + 1e-9).reciprocal().contiguous()


if triton is not None:

    @triton.jit
    def _snake_kernel(x_ptr, alpha_ptr, inverse_ptr, out_ptr,  # [B, C, T], [C], [C], [B, C, T]
                      C, T, BLOCK_: tl.constexpr):
        row = tl.program_id(0)  # b * C + c
        steps = tl.program_id(1) * BLOCK_ + tl.arange(0, BLOCK_)
        inside = steps < T
        alpha = tl.load(alpha_ptr + row % C)
        inverse = tl.load(inverse_ptr + row % C)
        offsets = row.to(tl.int64) * T + steps
        x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        s = tl.sin(alpha * x)  # (libdevice's accurate sinf in the PTX, not sin.approx)
        y = x + inverse * (s * s)
        tl.store(out_ptr + offsets, round_to(y, out_ptr.dtype.element_ty), mask=inside)


def snake_kernel(x: torch.Tensor, alpha: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """snake_reference's result in one launch; alpha float32 [1, C, 1] (contiguous: a view of
    it is read), inverse = snake_inverse(alpha)."""
    B, C, T = x.shape
    assert alpha.dtype == torch.float32 and alpha.is_contiguous() and inverse.shape == (C,)
    x = x.contiguous()
    alpha = alpha.view(C)
    out = torch.empty_like(x)
    _snake_kernel[(B * C, triton.cdiv(T, BLOCK))](x, alpha, inverse, out, C, T, BLOCK_=BLOCK)
    return out

"""Rounding float32 to a storage dtype inside Triton kernels, the same on the GPU and in the interpreter.

Design choices:
- bfloat16 rounding is done on the bits (round to nearest, ties to even, as the GPU's
  cvt.rn and torch's `.to(torch.bfloat16)` do): Triton's CPU interpreter truncates in
  its float casts, so a plain `.to(tl.bfloat16)` would make CPU tests of a kernel
  disagree with torch in the last bit. The rounded value is exact in bfloat16, so the
  store (or a later cast) no longer rounds, on either backend. Other dtypes cast plainly.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton
    triton = None
    tl = None

if triton is not None:

    @triton.jit
    def round_to(x, dtype: tl.constexpr):
        """float32 x rounded to `dtype` and returned in it (bfloat16: ties to even, NaN kept)."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            rounded = tl.where(x != x, bits | 0x00400000, rounded)  # NaN stays a (quiet) NaN
            return rounded.to(tl.float32, bitcast=True).to(tl.bfloat16)
        else:
            return x.to(dtype)

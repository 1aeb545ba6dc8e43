"""Building blocks shared by Helium (the temporal transformer), the depformer and Mimi.

Design choices:
- Parameter names follow the checkpoint keys (`alpha`, `linear_in`, `linear_out`), so
  loading is `load_state_dict` with no rename.
- RoPE is interleaved (pairs x[2i], x[2i+1]) at each row's absolute position. The angles
  are computed in float64 and only then rounded to float32: a call of an hour reaches
  position 45,000 (Mimi's transformers 90,000), where a float32 product `freq * position`
  is off by up to 4e-3 rad and keys and queries would drift apart; in float64 the angle
  keeps its precision at any length, and below a few thousand positions the tables equal
  Moshi's float32 ones to rounding (tests/engine/personaplex/test_long_calls.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Moshi's rms_norm_f32: fp32 statistics, eps 1e-8, weight `alpha` [1, 1, dim]."""

    def __init__(self, dim: int, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        var = self.eps + torch.mean(xf * xf, dim=-1, keepdim=True)
        return (xf * (self.alpha.float() * torch.rsqrt(var))).to(x.dtype)


class GatedMLP(nn.Module):
    """`linear_in` holds gate and up fused; out = linear_out(silu(gate) * up)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_in(x)
        h = h.view(*h.shape[:-1], 2, -1)  # [B, T, 2, hidden]
        out: torch.Tensor = self.linear_out(F.silu(h[..., 0, :]) * h[..., 1, :])
        return out


def rope_tables(positions: torch.Tensor, head_dim: int, max_period: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, T, head_dim / 2] (float32) of the absolute positions [B, T]."""
    freqs = torch.exp(torch.arange(head_dim // 2, device=positions.device, dtype=torch.float32)
                      * (-math.log(max_period) * 2 / head_dim))  # Moshi's float32 frequencies
    angle = freqs.double() * positions.double()[:, None, :, None]  # exact at any call length
    return torch.cos(angle).float(), torch.sin(angle).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of x [B, H, T, D] (computed in fp32)."""
    pairs = x.view(*x.shape[:-1], x.shape[-1] // 2, 2)
    re, im = pairs[..., 0].float(), pairs[..., 1].float()
    return torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], dim=-1).view(x.shape)

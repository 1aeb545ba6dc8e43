"""Building blocks shared by Helium (the temporal transformer) and Mimi's transformers.

Design choices:
- Parameter names follow the checkpoint keys (`in_proj_weight`, `out_proj.weight`,
  `alpha`), so loading is `load_state_dict` with no rename.
- Streaming attention reads a static ring of keys and values, preallocated per slot by
  `setup_ring(batch)`. The caller passes each row's absolute positions; the ring slot of
  position p is p % capacity, and the position a slot holds is recomputed from the row's
  last written position. A key is visible when 0 <= q - p < context and p >= 0, as in
  Moshi's `RingKVCache` (capacity = context). Keys of a chunk are written before any query
  reads, so with T > 1 (Mimi writes 2 positions a frame) the first query of a chunk
  already misses the oldest slot, exactly as Moshi does once the ring has wrapped.
- A row's history is forgotten by giving it negative positions: nothing below 0 is ever
  visible. The one exception is a query's own key, always visible, so a row ticked at
  position -1 (a recycled slot's sacrifice tick) attends to itself instead of to nothing.
- RoPE is interleaved (pairs x[2i], x[2i+1]), computed in fp32 at the absolute position.
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
        return self.linear_out(F.silu(h[..., 0, :]) * h[..., 1, :])


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               max_period: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate interleaved pairs of q, k [B, H, T, D] by their absolute positions [B, T]."""
    D = q.shape[-1]
    freqs = torch.exp(torch.arange(D // 2, device=q.device, dtype=torch.float32) * (-math.log(max_period) * 2 / D))
    angle = freqs * positions.float()[:, None, :, None]  # [B, 1, T, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = x.view(*x.shape[:-1], D // 2, 2)
        re, im = pairs[..., 0].float(), pairs[..., 1].float()
        out = torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], dim=-1)
        return out.view(x.shape)

    return rotate(q), rotate(k)


def ring_mask(positions: torch.Tensor, capacity: int, context: int) -> torch.Tensor:
    """Which ring slots each query sees: bool [B, 1, T, capacity] for positions [B, T]."""
    last = positions[:, -1:]  # [B, 1]
    slots = torch.arange(capacity, device=positions.device)
    held = last - torch.remainder(last - slots, capacity)  # [B, capacity]: the position each slot holds
    q = positions[:, :, None]  # [B, T, 1]
    p = held[:, None, :]  # [B, 1, capacity]
    visible = (p >= 0) & (p <= q) & (q - p < context)
    return (visible | (p == q))[:, None]


class RingAttention(nn.Module):
    """Causal self-attention over a per-slot ring of `capacity` past positions, with RoPE."""

    def __init__(self, dim: int, num_heads: int, capacity: int, max_period: float):
        super().__init__()
        self.num_heads = num_heads
        self.capacity = capacity
        self.max_period = max_period
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)
        self.register_buffer("keys", torch.zeros(0), persistent=False)
        self.register_buffer("values", torch.zeros(0), persistent=False)

    def setup_ring(self, batch: int) -> None:
        dim = self.out_proj.weight.shape[0]
        w = self.in_proj_weight
        shape = (batch, self.num_heads, self.capacity, dim // self.num_heads)
        self.keys = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.values = torch.zeros(shape, dtype=w.dtype, device=w.device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        qkv = F.linear(x, self.in_proj_weight).view(B, T, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, Dh]
        q, k = apply_rope(q, k, positions, self.max_period)
        slots = torch.remainder(positions, self.capacity)  # [B, T]
        index = slots[:, None, :, None].expand_as(k)
        self.keys.scatter_(2, index, k)
        self.values.scatter_(2, index, v)
        out = F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=mask)  # [B, H, T, Dh]
        return self.out_proj(out.transpose(1, 2).reshape(B, T, D))

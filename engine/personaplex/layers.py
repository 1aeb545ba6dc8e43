"""Building blocks shared by Helium (the temporal transformer) and Mimi's transformers.

Design choices:
- Parameter names follow the checkpoint keys (`in_proj_weight`, `out_proj.weight`,
  `alpha`), so loading is `load_state_dict` with no rename.
- Streaming attention reads a static ring of keys and values, preallocated per slot when
  its streams are set up (streaming.py). The caller passes each row's absolute
  positions; the ring slot of position p is p % capacity, and the position a slot holds is recomputed from the row's
  last written position. A key is visible when 0 <= q - p < context and p >= 0, as in
  Moshi's `RingKVCache` (capacity = context). Keys of a chunk are written before any query
  reads, so with T > 1 (Mimi writes 2 positions a frame) the first query of a chunk
  already misses the oldest slot, exactly as Moshi does once the ring has wrapped.
- A row's history is forgotten by giving it negative positions: nothing below 0 is ever
  visible, so restarting a row's stream needs nothing from the ring itself. The one
  exception is a query's own key, always visible, so a row ticked at position -1 (a
  reset slot's sacrifice tick) attends to itself instead of to nothing.
- RoPE is interleaved (pairs x[2i], x[2i+1]), computed in fp32 at the absolute position.
  The ring slots, the mask and the rope tables are computed once per forward (`ring_step`)
  and shared by all layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.personaplex.streaming import StreamingModule


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
    """cos, sin [B, 1, T, head_dim / 2] of the absolute positions [B, T], in fp32."""
    freqs = torch.exp(torch.arange(head_dim // 2, device=positions.device, dtype=torch.float32)
                      * (-math.log(max_period) * 2 / head_dim))
    angle = freqs * positions.float()[:, None, :, None]
    return torch.cos(angle), torch.sin(angle)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of x [B, H, T, D] (computed in fp32)."""
    pairs = x.view(*x.shape[:-1], x.shape[-1] // 2, 2)
    re, im = pairs[..., 0].float(), pairs[..., 1].float()
    return torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], dim=-1).view(x.shape)


def ring_mask(positions: torch.Tensor, capacity: int, context: int) -> torch.Tensor:
    """Which ring slots each query sees: bool [B, 1, T, capacity] for positions [B, T]."""
    last = positions[:, -1:]  # [B, 1]
    slots = torch.arange(capacity, device=positions.device)
    held = last - torch.remainder(last - slots, capacity)  # [B, capacity]: the position each slot holds
    q = positions[:, :, None]  # [B, T, 1]
    p = held[:, None, :]  # [B, 1, capacity]
    visible = (p >= 0) & (p <= q) & (q - p < context)
    return (visible | (p == q))[:, None]


@dataclass
class RingStep:
    """What every attention layer needs for one call, computed once per forward (`ring_step`)."""

    slots: torch.Tensor  # [B, T] ring slot of each new position
    mask: torch.Tensor  # [B, 1, T, capacity]
    cos: torch.Tensor  # [B, 1, T, head_dim / 2]
    sin: torch.Tensor


def ring_step(positions: torch.Tensor, capacity: int, context: int, head_dim: int, max_period: float) -> RingStep:
    cos, sin = rope_tables(positions, head_dim, max_period)
    return RingStep(torch.remainder(positions, capacity), ring_mask(positions, capacity, context), cos, sin)


class RingAttention(StreamingModule):
    """Causal self-attention over a per-slot ring of `capacity` past positions, with RoPE."""

    keys: torch.Tensor  # [B, heads, capacity, head_dim]
    values: torch.Tensor

    def __init__(self, dim: int, num_heads: int, capacity: int):
        super().__init__()
        self.num_heads = num_heads
        self.capacity = capacity
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)
        self.register_buffer("keys", torch.zeros(0), persistent=False)
        self.register_buffer("values", torch.zeros(0), persistent=False)

    def _setup_stream(self, batch: int) -> None:
        dim = self.out_proj.weight.shape[0]
        w = self.in_proj_weight
        shape = (batch, self.num_heads, self.capacity, dim // self.num_heads)
        self.keys = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.values = torch.zeros(shape, dtype=w.dtype, device=w.device)

    def forward(self, x: torch.Tensor, step: RingStep) -> torch.Tensor:
        B, T, D = x.shape
        qkv = F.linear(x, self.in_proj_weight).view(B, T, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, Dh]
        q, k = apply_rope(q, step.cos, step.sin), apply_rope(k, step.cos, step.sin)
        index = step.slots[:, None, :, None].expand_as(k)
        self.keys.scatter_(2, index, k)
        self.values.scatter_(2, index, v)
        out = F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=step.mask)  # [B, H, T, Dh]
        result: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(B, T, D))
        return result

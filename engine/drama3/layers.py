"""Building blocks shared by the Drama 3 backbone and tower: norm, rope, static KV cache,
attention over that cache.

Design choices:
- RMSNorm is zero-centred (`x_norm * (1 + w)`, computed in float32) everywhere in
  Drama 3: backbone and tower norms, and the per-head q/k norms. `RMSNorm.add` is a
  residual add with the norm after it, the one place a fused kernel can take both.
- Rope tables are built by `setup_caches` (one row per cache position), like gpt-fast:
  a model built on the meta device has no tables until its caches exist. Rotation runs
  in float32. The backbone rotates the first `rotary_dim` dims NeoX-style (halves), the
  tower GPT-J-style (even/odd pairs); the remaining dims pass through.
- `KVCache` is preallocated and indexed by slot: `[slots, max_rows, kv_heads, head_dim]`.
  A call writes its rows at `input_pos` and reads back the first `kv_len` rows of its
  slots; `attend` masks keys by position (key row j is visible to a query at position p
  iff j <= p), so one code path serves a prefill chunk, a whole prompt and a decode step,
  and stale rows of an earlier take are never seen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: the checkpoint stores w, the scale is 1 + w."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)

    def add(self, x: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + update), x + update): a residual add and the norm after it (the GPU fast
        path runs both as one kernel, engine/kernels/norm.py)."""
        summed = x + update
        return self(summed), summed

    def rotated(self, x: torch.Tensor, rope: torch.Tensor, interleaved: bool) -> torch.Tensor:
        """An attention layer's q or k norm and rope: norm(x [B, T, H, Dh]) with its first rotary
        dims rotated by rope [B, T, 2, rot/2], as (even, odd) pairs or as halves (the GPU fast
        path runs both as one kernel for prefill chunks, engine/kernels/norm.py)."""
        return (rope_interleaved if interleaved else rope_neox)(self(x), rope)


def rope_table(rows: int, rotary_dim: int, base: float, device: torch.device | str) -> torch.Tensor:
    """cos and sin of every position: float32 [rows, 2, rotary_dim // 2]."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    angles = torch.arange(rows, dtype=torch.float64, device=device)[:, None] * inv_freq  # [rows, rot/2]
    return torch.stack((angles.cos(), angles.sin()), dim=1).float()


def rope_neox(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary dims of x [B, T, H, Dh] as halves; rope [B, T, 2, rot/2]."""
    half = rope.shape[-1]
    cos, sin = rope[:, :, None, 0], rope[:, :, None, 1]  # [B, T, 1, rot/2]
    first, second, rest = x[..., :half].float(), x[..., half:2 * half].float(), x[..., 2 * half:]
    rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return torch.cat((rotated.type_as(x), rest), dim=-1)


def rope_interleaved(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary dims of x [B, T, H, Dh] as (even, odd) pairs; rope [B, T, 2, rot/2]."""
    half = rope.shape[-1]
    cos, sin = rope[:, :, None, 0], rope[:, :, None, 1]  # [B, T, 1, rot/2]
    pairs, rest = x[..., :2 * half].float().unflatten(-1, (half, 2)), x[..., 2 * half:]
    even, odd = pairs[..., 0], pairs[..., 1]  # [B, T, H, rot/2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((rotated.type_as(x), rest), dim=-1)


class KVCache(nn.Module):
    """Keys and values of one attention layer for every slot: [slots, max_rows + 1, kv_heads, head_dim].

    The spare row is never written or read: with it no read (`kv_len` <= max_rows) covers
    the whole row dimension. Compiled with a symbolic `kv_len`, a slice that may equal the
    whole dimension gets a guard on it, and the largest KV bucket then compiled every
    decode layer a second time (minutes of warm-up at the full size)."""

    k: torch.Tensor
    v: torch.Tensor

    def __init__(self, slots: int, max_rows: int, kv_heads: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.max_rows = max_rows
        shape = (slots, max_rows + 1, kv_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    def write(self, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor) -> None:
        """Write k, v [B, T, Hkv, Dh] at input_pos [B, T] of the slots [B]."""
        rows = slots[:, None].expand_as(input_pos)  # [B, T]
        self.k.index_put_((rows, input_pos), k.to(self.k.dtype))
        self.v.index_put_((rows, input_pos), v.to(self.v.dtype))

    def update(self, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
               kv_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, T, Hkv, Dh] at input_pos [B, T]; return the first kv_len rows of the slots."""
        self.write(k, v, input_pos, slots)
        rows_read = kv_len or self.max_rows
        return self.k[slots, :rows_read], self.v[slots, :rows_read]  # [B, S, Hkv, Dh] each


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """Causal GQA of q [B, T, H, Dh] over cache rows k, v [B, S, Hkv, Dh]: out [B, T, H, Dh].

    Key row j is visible to the query at position p iff j <= p (scale 1/sqrt(Dh)).
    """
    visible = torch.arange(k.shape[1], device=q.device) <= input_pos[..., None]  # [B, T, S]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=visible[:, None], enable_gqa=q.shape[2] != k.shape[2],
    )  # [B, H, T, Dh]
    return out.transpose(1, 2)

"""The codec's window-limited causal transformer (the quantiser's pre and post modules, the
encoder's last block), with the memory a streamed decode carries from window to window.

Design choices:
- Module names follow codec.pth (`quantizer.post_module.layers.3.attention.wqkv`).
- Numerics follow the release where they matter for parity: RoPE cos/sin are rounded to
  bfloat16 (the release precomputes them in bfloat16) and applied in float32, RMSNorm runs
  in float32.
- Step t attends to steps (t - window, t]. A call may be given a `Memory`: each layer's keys
  and values of the frames just before its own (already rotated at their positions) and the
  position of its first frame, so the call's frames see exactly what they would see in one
  call over the whole clip: a streamed window then runs only its new frames (codec_stream.py)
  where it ran hundreds of frames of left context again each time. Positions are the clip's
  own (0 at its first frame); without a memory a call starts at 0 with nothing before it.
  The call puts each layer's keys and values, the memory's followed by its own, back in the
  memory; which of them to keep for the next call is the caller's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Memory:
    """What a transformer call attends to before its own frames."""

    start: torch.Tensor  # [B] long: the position of the call's first frame in its clip
    keys: list[torch.Tensor]  # per layer [B, H, P, Dh]: frames start - P ... start - 1 (any before 0 unused)
    values: list[torch.Tensor]  # per layer [B, H, P, Dh]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In x's dtype, as the release's in-place x.mul_(gamma): under bfloat16 autocast
        # the scaled branch is rounded to bfloat16 before the residual add.
        return (x * self.gamma).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, head_dim: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.wqkv = nn.Linear(dim, 3 * n_head * head_dim, bias=False)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's output [B, T, D] and its keys and values [B, H, P + T, Dh], the past ones first."""
        batch, length, _ = x.shape
        qkv = self.wqkv(x).view(batch, length, 3, self.n_head, self.head_dim)  # [B, T, 3, H, Dh]
        q, k = apply_rope(qkv[:, :, :2], rope).unbind(2)  # [B, T, H, Dh] each, rotated in one pass
        v = qkv[:, :, 2]
        keys = torch.cat((past_keys, k.transpose(1, 2)), 2)  # [B, H, P + T, Dh]
        values = torch.cat((past_values, v.transpose(1, 2)), 2)  # [B, H, P + T, Dh]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)  # [B, H, T, Dh]
        out: torch.Tensor = self.wo(y.transpose(1, 2).reshape(batch, length, -1))
        return out, keys, values


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, head_dim: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(dim, n_head, head_dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_layer_scale = LayerScale(dim)
        self.ffn_layer_scale = LayerScale(dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, keys, values = self.attention(self.attention_norm(x), rope, mask, past_keys, past_values)
        x = x + self.attention_layer_scale(attended)
        out: torch.Tensor = x + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(x)))
        return out, keys, values


def rope_table(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """[B, T, Dh/2, 2, 2] at positions [B, T]: cos/sin rounded to bfloat16 as the release stores
    them, laid out for `apply_rope` as (cos, cos) and (-sin, sin) per pair, in float32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device)[: head_dim // 2].float()
                               / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [B, T, Dh/2]
    cos, sin = angles.cos().to(torch.bfloat16).float(), angles.sin().to(torch.bfloat16).float()
    return torch.stack((torch.stack((cos, cos), -1), torch.stack((-sin, sin), -1)), -2)  # [B, T, Dh/2, 2, 2]


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x0, x1) of x [B, T, ..., Dh] in float32: (x0 cos - x1 sin,
    x1 cos + x0 sin), as the release computes them (x1 (-sin) added is x1 sin subtracted,
    exactly), in four launches however many heads (q and k together) x holds."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, T, ..., Dh/2, 2]
    shape = (rope.shape[0], rope.shape[1], *(1,) * (x.dim() - 3), rope.shape[2], 2)
    cos, sin = rope[..., 0, :].reshape(shape), rope[..., 1, :].reshape(shape)  # [B, T, 1.., Dh/2, 2]
    out: torch.Tensor = (pairs * cos + pairs.flip(-1) * sin).flatten(-2).type_as(x)
    return out


class WindowLimitedTransformer(nn.Module):
    """Causal transformer on [B, C, T] whose step t attends to steps (t - window, t]."""

    def __init__(self, input_dim: int, dim: int, n_layer: int, n_head: int, head_dim: int, hidden: int,
                 window: int, rope_base: float, eps: float) -> None:
        super().__init__()
        self.window, self.n_head, self.head_dim, self.rope_base = window, n_head, head_dim, rope_base
        self.input_dim = input_dim  # channels in and out
        self.layers = nn.ModuleList(TransformerBlock(dim, n_head, head_dim, hidden, eps) for _ in range(n_layer))
        self.norm = RMSNorm(dim, eps)
        self.input_proj = nn.Linear(input_dim, dim) if input_dim != dim else nn.Identity()
        self.output_proj = nn.Linear(dim, input_dim) if input_dim != dim else nn.Identity()

    def forward(self, x: torch.Tensor, memory: Memory | None = None) -> torch.Tensor:  # [B, C, T]
        batch, length = x.shape[0], x.shape[-1]
        x = self.input_proj(x.transpose(1, 2))  # [B, T, D]
        if memory is None:  # the whole clip: from position 0, nothing before it
            empty = x.new_zeros(batch, self.n_head, 0, self.head_dim)
            memory = Memory(torch.zeros(batch, dtype=torch.long, device=x.device),
                            [empty] * len(self.layers), [empty] * len(self.layers))
        past = memory.keys[0].shape[2]
        positions = memory.start[:, None] + torch.arange(length, device=x.device)  # [B, T]
        key_positions = memory.start[:, None] + torch.arange(-past, length, device=x.device)  # [B, P + T]
        back = positions[:, :, None] - key_positions[:, None, :]  # [B, T, P + T]
        mask = ((back >= 0) & (back < self.window) & (key_positions[:, None, :] >= 0))[:, None]  # [B, 1, T, P + T]
        rope = rope_table(positions, self.head_dim, self.rope_base)  # [B, T, Dh/2, 2]
        for i, layer in enumerate(self.layers):
            x, memory.keys[i], memory.values[i] = layer(x, rope, mask, memory.keys[i], memory.values[i])
        out: torch.Tensor = self.output_proj(self.norm(x)).transpose(1, 2)
        return out

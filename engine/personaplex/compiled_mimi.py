"""Mimi's transformer layers for a tick with their small ops compiled: encode and decode in fewer launches.

    layer = CompiledMimiLayer()             # Mimi's layer function (mimi.py `LayerFn`)
    codes = mimi.encode(pcm, layer)         # and pcm = mimi.decode(codes, layer)

Design choices:
- Mimi's two transformers (8 layers each at the released size, 2 positions a tick, float32)
  are most of its launches: eagerly a layer is ~45 ops around its 4 matmuls (LayerNorms,
  RoPE on queries and keys, the ring write, attention, layer scales, GELU, residuals;
  torch.profiler on the CPU counts ~390 that launch a kernel per transformer, so ~780 a
  tick), each a few microseconds at one conversation, where the whole tick is ~12 ms.
- Two compiled functions a layer: `before` (LayerNorm, projection, RoPE) and `after` (the
  attention over the ring, which only reads it, then output projection, layer scale,
  residual, LayerNorm, MLP with GELU, layer scale, residual); Inductor fuses the small ops
  around the matmuls and the attention. The ring write stays eager (ring.py `store`, a
  scatter in place: inside a compiled function it could become a copy of the ring), as
  Helium's does (compiled_temporal.py).
- One compile per function serves every layer of both transformers (the weights are
  arguments); the batch becomes dynamic from 2 (1 is Dynamo's own case).
- A compile that fails gives way to the eager layer from then on, logged once; inside a
  CUDA graph capture it raises (the capture's warm-up call compiled it already).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from engine.personaplex.compiled_depformer import Backend, compiled_or_eager
from engine.personaplex.layers import apply_rope
from engine.personaplex.mimi import MimiLayer
from engine.personaplex.ring import RingStep, masked_attention


def before(x: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor, w_qkv: torch.Tensor,
           cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
           eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, T, D] -> query, key and value [B, H, T, Dh], RoPE applied to the first two."""
    B, T, D = x.shape
    h = F.layer_norm(x, (D,), norm_weight, norm_bias, eps)
    q, k, v = F.linear(h, w_qkv).view(B, T, 3, num_heads, D // num_heads).permute(2, 0, 3, 1, 4)
    return apply_rope(q, cos, sin).contiguous(), apply_rope(k, cos, sin).contiguous(), v.contiguous()


def after(x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
          w_out: torch.Tensor, scale_1: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
          w_in: torch.Tensor, w_mlp_out: torch.Tensor, scale_2: torch.Tensor, eps: float,
          guard: bool) -> torch.Tensor:
    """The layer's input x [B, T, D], its query [B, H, T, Dh] and its ring (this call's keys stored) -> its output."""
    B, T, D = x.shape
    out = masked_attention(q, keys, values, mask, guard).transpose(1, 2).reshape(B, T, D)
    x = x + scale_1 * F.linear(out, w_out)
    h = F.layer_norm(x, (D,), norm_weight, norm_bias, eps)
    return x + scale_2 * F.linear(F.gelu(F.linear(h, w_in)), w_mlp_out)


@functools.cache
def _compiled(backend: Backend) -> tuple[Callable[..., tuple[torch.Tensor, ...]], Callable[..., torch.Tensor]]:
    return (cast(Callable[..., tuple[torch.Tensor, ...]], torch.compile(before, backend=backend)),
            cast(Callable[..., torch.Tensor], torch.compile(after, backend=backend)))


class CompiledMimiLayer:
    """`MimiLayer.forward` in two compiled calls around the ring write (a `LayerFn` for Mimi)."""

    def __init__(self, backend: Backend = "inductor") -> None:
        self.backend = backend
        self.failed: str | None = None

    def layer(self, layer: MimiLayer, h: torch.Tensor, step: RingStep) -> torch.Tensor:
        attn = layer.self_attn
        assert not attn.float8  # Mimi's rings hold the weights' dtype
        first, second = _compiled(self.backend)
        if h.shape[0] > 1:  # one compile for every batch of 2 or more
            for tensor in (h, step.cos, step.sin, step.mask):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        q, k, v = first(h, layer.norm1.weight.detach(), layer.norm1.bias.detach(), attn.in_proj_weight.detach(),
                        step.cos, step.sin, attn.num_heads, layer.norm1.eps)
        attn.store(*attn.stored(k), *attn.stored(v), step)
        rows = step.rows
        keys, values = attn.keys[rows], attn.values[rows]
        if h.shape[0] > 1:
            for tensor in (q, keys, values):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return second(h, q, keys, values, step.mask, attn.out_proj.weight.detach(),
                      layer.layer_scale_1.scale.detach(), layer.norm2.weight.detach(), layer.norm2.bias.detach(),
                      layer.linear1.weight.detach(), layer.linear2.weight.detach(),
                      layer.layer_scale_2.scale.detach(), layer.norm2.eps, not attn.clear_on_reset)

    def __call__(self, layer: MimiLayer, h: torch.Tensor, step: RingStep) -> torch.Tensor:
        key = (self.backend, "mimi", min(h.shape[0], 2), h.shape[1], torch.is_grad_enabled())
        return compiled_or_eager(self, "Mimi layers", key, lambda: self.layer(layer, h, step),
                                 lambda: cast(torch.Tensor, layer(h, step)))

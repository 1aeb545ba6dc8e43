"""Helium's tick (one position per slot) with the small ops around each layer's attention compiled.

    helium = CompiledTemporal(temporal)        # called as Temporal.forward is, for one position
    hidden, text_logits = helium(x, positions, rows)

Design choices:
- Eagerly a layer of a tick is ~60 small kernels around 4 matmuls and the ring attention:
  the float32 RMSNorms (6 kernels each), RoPE on queries and keys (~10 each), the float8
  quantisation of the new key and value (~6 each); 32 layers make ~1,900 launches a tick,
  microseconds each at batch 1. Here two compiled functions do a layer: `before` (norm,
  projection, RoPE, the ring's form of the new key and value) and `after` (output
  projection, residual, norm, gated MLP, residual); Inductor fuses the small ops into a few
  kernels around the matmuls.
- The ring itself stays eager, as the module does it (ring.py `store` and `attend`: the
  scatter into the ring and the fused ring-attention kernel): a write into a ring of
  thousands of positions inside a compiled function could be copied whole, and the fused
  kernel is already one launch.
- One compile per function serves all 32 layers (the weights are arguments); the batch
  becomes dynamic from 2 (size 1 is its own specialisation), as for the depformer
  (compiled_depformer.py, which keeps the compile log and falls back the same way).
- Only the tick: a system prompt (many positions, `Temporal.trunk`) stays eager.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from engine.personaplex.compiled_depformer import Backend, compiled_or_eager, rms
from engine.personaplex.layers import apply_rope
from engine.personaplex.ring import quantize_kv, ring_step
from engine.personaplex.temporal import Layer, Temporal


def before(x: torch.Tensor, alpha: torch.Tensor, w_qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           num_heads: int, eps: float, float8: bool, ring_dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """x [B, 1, D] -> the query [B, H, 1, Dh] and the key and value as the ring stores them (with scales)."""
    B, T, D = x.shape
    qkv = F.linear(rms(x, alpha, eps), w_qkv).view(B, T, 3, num_heads, D // num_heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, Dh]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if float8:
        (k, key_scale), (v, value_scale) = quantize_kv(k), quantize_kv(v)
        return q.contiguous(), k.contiguous(), key_scale.contiguous(), v.contiguous(), value_scale.contiguous()
    return q.contiguous(), k.to(ring_dtype).contiguous(), None, v.to(ring_dtype).contiguous(), None


def after(x: torch.Tensor, out: torch.Tensor, w_out: torch.Tensor, alpha: torch.Tensor, w_mlp_in: torch.Tensor,
          w_mlp_out: torch.Tensor, eps: float) -> torch.Tensor:
    """The layer's input x [B, 1, D] and its attention out [B, H, 1, Dh] -> the layer's output [B, 1, D]."""
    B, T, D = x.shape
    x = x + F.linear(out.transpose(1, 2).reshape(B, T, D), w_out)
    g = F.linear(rms(x, alpha, eps), w_mlp_in)
    g = g.view(B, T, 2, -1)  # gate and up
    return x + F.linear(F.silu(g[..., 0, :]) * g[..., 1, :], w_mlp_out)


@functools.cache
def _compiled(backend: Backend) -> tuple[Callable[..., tuple[torch.Tensor, ...]], Callable[..., torch.Tensor]]:
    return (cast(Callable[..., tuple[torch.Tensor, ...]], torch.compile(before, backend=backend)),
            cast(Callable[..., torch.Tensor], torch.compile(after, backend=backend)))


class CompiledTemporal:
    """`Temporal.forward` for one position per slot, each layer's small ops in two compiled calls."""

    def __init__(self, temporal: Temporal, backend: Backend = "inductor") -> None:
        self.temporal = temporal
        self.backend = backend
        self.failed: str | None = None

    def layers(self, x: torch.Tensor, positions: torch.Tensor, rows: slice,
               active: torch.Tensor | None) -> torch.Tensor:
        cfg = self.temporal.cfg
        step = ring_step(positions, cfg.context, cfg.context, cfg.dim // cfg.num_heads, cfg.max_period, rows, active)
        first, second = _compiled(self.backend)
        if x.shape[0] > 1:  # one compile for every batch of 2 or more
            for tensor in (x, step.cos, step.sin):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        for module in self.temporal.transformer.layers:
            layer = cast(Layer, module)
            attn = layer.self_attn
            q, k, key_scale, v, value_scale = first(x, layer.norm1.alpha.detach(), attn.in_proj_weight.detach(),
                                                    step.cos, step.sin, attn.num_heads, layer.norm1.eps, attn.float8,
                                                    attn.keys.dtype)
            attn.store(k, key_scale, v, value_scale, step)
            out = attn.attend(q, step)  # [B, H, 1, Dh]
            if x.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(out, 0)
            x = second(x, out, attn.out_proj.weight.detach(), layer.norm2.alpha.detach(),
                       layer.gating.linear_in.weight.detach(), layer.gating.linear_out.weight.detach(), layer.norm2.eps)
        return x

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, rows: slice,
                 active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, 1, D] at positions [B, 1] -> (hidden [B, 1, D] after out_norm, text logits [B, 1, text_card])."""
        temporal = self.temporal

        def compiled() -> tuple[torch.Tensor, torch.Tensor]:
            hidden = temporal.out_norm(self.layers(x, positions, rows, active))
            return hidden, temporal.text_linear(hidden)

        key = (self.backend, "temporal", min(x.shape[0], 2), 1, torch.is_grad_enabled())
        return compiled_or_eager(self, "Helium layers", key, compiled,
                                 lambda: cast(tuple[torch.Tensor, torch.Tensor], temporal(x, positions, rows, active)))

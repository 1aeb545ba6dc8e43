"""The Drama 3 backbone: the Qwen3.5-MoE hybrid text model, driven by frame embeddings.

    x = embeds                                    # model.embed(frames): [B, T, D]
    for layer: x = x + mixer(input_layernorm(x));  x = x + mlp(post_attention_layernorm(x))
    hidden = norm(x)                              # the lm_head input, and the tower's

where `mixer` is Gated DeltaNet (`linear_attn`, deltanet.py) on 3 layers in 4 and gated
full attention (`self_attn`) on every 4th; every `mlp` is a mixture of experts (moe.py).

Design choices:
- Module and parameter names follow the checkpoint (`model.language_model.` becomes
  `backbone.`), so loading is a rename table, not code.
- One forward for every phase: `backbone(embeds, input_pos, slots, kv_len)` runs a prompt
  chunk or one decode row per slot against the static caches made by `setup_caches`;
  `kv_len` (a static bucket >= max(input_pos) + 1, or None for all rows) bounds the
  attended cache rows.
- Full attention: `q_proj` gives each head its query and its output gate side by side
  ([q_h | gate_h] per head); q and k get per-head zero-centred RMSNorm, then NeoX rope on
  the first `head_dim * partial_rotary_factor` dims; output `o_proj(attn * sigmoid(gate))`.
- q/k/v projections read the same input: `project` runs them, and the fast path
  (fast.py `fuse_projections`) replaces it with one GEMM over their stacked weights.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from engine.drama3.config import TextConfig
from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.layers import KVCache, RMSNorm, attend, rope_table
from engine.drama3.moe import SparseMoE


class GatedAttention(nn.Module):
    """`self_attn` of a full-attention layer."""

    projections = ("q_proj", "k_proj", "v_proj")  # the linears of `project`, in its order

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        D, H, Hkv, Dh = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.heads, self.kv_heads, self.head_dim = H, Hkv, Dh
        self.q_proj = nn.Linear(D, 2 * H * Dh, bias=False)
        self.k_proj = nn.Linear(D, Hkv * Dh, bias=False)
        self.v_proj = nn.Linear(D, Hkv * Dh, bias=False)
        self.o_proj = nn.Linear(H * Dh, D, bias=False)
        self.q_norm = RMSNorm(Dh, config.rms_norm_eps)
        self.k_norm = RMSNorm(Dh, config.rms_norm_eps)
        self.kv_cache: KVCache | None = None

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, D] -> q with gates [B, T, 2*H*Dh], k and v [B, T, Hkv*Dh] (one GEMM once fused)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
                kv_len: int | None) -> torch.Tensor:
        q, k, v = self.project(x)
        q, gate = q.unflatten(-1, (self.heads, 2 * self.head_dim)).chunk(2, dim=-1)  # [B, T, H, Dh]
        k = k.unflatten(-1, (self.kv_heads, self.head_dim))  # [B, T, Hkv, Dh]
        v = v.unflatten(-1, (self.kv_heads, self.head_dim))
        q = self.q_norm.rotated(q, rope, interleaved=False)
        k = self.k_norm.rotated(k, rope, interleaved=False)
        out = self.attend_cache(q, k, v, input_pos, slots, kv_len)  # [B, T, H, Dh]
        y: torch.Tensor = self.o_proj((out * torch.sigmoid(gate)).flatten(-2))  # [B, T, D]
        return y

    def attend_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor,
                     slots: torch.Tensor, kv_len: int | None) -> torch.Tensor:
        """k, v [B, T, Hkv, Dh] into the cache at input_pos [B, T], then q [B, T, H, Dh] over the
        slots' first kv_len rows -> [B, T, H, Dh]. (The fast path's `cache_attention` kernel
        replaces it for one-row calls: fast.py.)"""
        assert self.kv_cache is not None, "setup_caches allocates the cache"
        keys, values = self.kv_cache.update(k, v, input_pos, slots, kv_len)
        return attend(q, keys, values, input_pos)


class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig, kind: str, fp8_experts: bool) -> None:
        super().__init__()
        if kind == "full_attention":
            self.self_attn = GatedAttention(config)
        else:
            self.linear_attn = GatedDeltaNet(config)
        self.full_attention = kind == "full_attention"
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoE(config, fp8_experts)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
                kv_len: int | None, valid: torch.Tensor | None = None) -> torch.Tensor:
        normed, x = self.mix(x, rope, input_pos, slots, kv_len, valid)
        out: torch.Tensor = x + self.mlp(normed)
        return out

    def mix(self, x: torch.Tensor, rope: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
            kv_len: int | None, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's first half, where rows meet their slot's history: x + mixer(norm(x)) and
        its norm, the experts' input. (The second half, `mlp`, treats each row alone: a mixed
        step runs it once over the rows of several calls, mixed.py.)"""
        h = self.input_layernorm(x)
        if self.full_attention:  # fixed per layer by config.layer_types
            h = self.self_attn(h, rope, input_pos, slots, kv_len)
        else:
            h = self.linear_attn(h, input_pos, slots, valid)
        return self.post_attention_layernorm.add(x, h)  # norm(x + h), x + h


class Backbone(nn.Module):
    rope: torch.Tensor  # [max_rows, 2, rot/2] float32, made by setup_caches

    def __init__(self, config: TextConfig, fp8_experts: bool) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, kind, fp8_experts) for kind in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.register_buffer("rope", None, persistent=False)

    def setup_caches(self, slots: int, max_rows: int, device: torch.device | str, dtype: torch.dtype) -> None:
        c = self.config
        for layer in cast(list[DecoderLayer], list(self.layers)):
            if layer.full_attention:
                layer.self_attn.kv_cache = KVCache(slots, max_rows, c.num_key_value_heads, c.head_dim, device, dtype)
            else:
                layer.linear_attn.setup_cache(slots, device, dtype)
        self.rope = rope_table(max_rows, c.rotary_dim, c.rope_theta, device)

    def forward(self, embeds: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
                kv_len: int | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [B, T, D], input_pos [B, T], slots [B] -> final-normed hidden [B, T, D].
        valid [B]: real rows of each (the rest padding, written past them and never read
        before a later row overwrites them; DeltaNet skips them); None: every row."""
        rope = self.rope[input_pos]  # [B, T, 2, rot/2]
        x = embeds
        for layer in self.layers:
            x = layer(x, rope, input_pos, slots, kv_len, valid)
        hidden: torch.Tensor = self.norm(x)
        return hidden

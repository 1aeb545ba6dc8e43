"""The Drama 3 audio tower (codebook-MTP decoder): codes 1..9 of a frame, attending over time.

A frame row is [main token, code0, .., code9]; code0 = main - semantic_start for audio
rows, and text rows carry zeros. Given the backbone's final-normed hidden state h_t of
input frame F_t and the new frame's main token (reference/drama3.md §2.3-2.7):

    semantic = main is in the semantic band        # "the label is semantic"; EOS/text: no code input
    h = shared_layers(h_t, code0, extra = codebooks K_b+1..9 of F_t)    # 4 layers
    for j in 0..8:  h = residual_layers[j](h, code_j);  code_{j+1} ~ heads[j](h)

One tower layer mixes a code embedding into the hidden state, then runs a pre-norm block:

    e = semantic * embedding(code) (+ extra on the first shared layer)
    x = eh_proj([enorm(e), hnorm(h)]);  x = x + attention(attention_norm(x))
    x = x + feed_forward(ffn_norm(x));  out = final_layernorm(x)

Design choices:
- Every tower layer keeps a KV cache across frames, at the backbone's positions (the
  codebook index picks the layer, not the rope position); caches are static, per slot.
- Attention: `wqkv` rows are [all Q | all gates | K | V] as in the checkpoint; per-head
  zero-centred q/k norms, then INTERLEAVED (GPT-J) rope on the first
  head_dim * rotary_percent dims with base rope_base; output wo(attn * sigmoid(gate)).
- The generation loop composes the pieces with sampling: `run_shared`, then
  `residual_layers[j]` and `heads[j]`. `prefill` teacher-forces prompt rows: row p is
  labelled by row p + 1; the last prompt row is filled by the first decode step at its
  position. Layers accept [B, D] rows (with [B] codes and positions) or [B, T, D].
- Module names follow the checkpoint keys inside each layer; the loader's rename table
  maps the layer stacks and `semantic_embedding` / `codebook_embedding` to `embedding`.
- `wqkv` comes fused in the checkpoint; the feed-forward's w1 and w3 are separate, run by
  its `project`, which the fast path (fast.py `fuse_projections`) makes one GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.drama3.config import Drama3Config, TowerConfig
from engine.drama3.layers import KVCache, RMSNorm, attend, rope_table


class TowerAttention(nn.Module):
    def __init__(self, config: TowerConfig) -> None:
        super().__init__()
        D, H, Hkv, Dh = config.dim, config.n_head, config.n_local_heads, config.head_dim
        self.heads, self.kv_heads, self.head_dim = H, Hkv, Dh
        self.wqkv = nn.Linear(D, 2 * H * Dh + 2 * Hkv * Dh, bias=False)
        self.wo = nn.Linear(H * Dh, D, bias=False)
        self.q_norm = RMSNorm(Dh, config.norm_eps)
        self.k_norm = RMSNorm(Dh, config.norm_eps)
        self.kv_cache: KVCache | None = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
                kv_len: int | None) -> torch.Tensor:
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, gate, k, v = self.wqkv(x).split((q_width, q_width, kv_width, kv_width), dim=-1)
        q = self.q_norm.rotated(q.unflatten(-1, (self.heads, self.head_dim)), rope, interleaved=True)  # [B, T, H, Dh]
        k = self.k_norm.rotated(k.unflatten(-1, (self.kv_heads, self.head_dim)), rope, interleaved=True)
        out = self.attend_cache(q, k, v.unflatten(-1, (self.kv_heads, self.head_dim)), input_pos, slots, kv_len)
        y: torch.Tensor = self.wo(out.flatten(-2) * torch.sigmoid(gate))  # [B, T, D]
        return y

    def attend_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor,
                     slots: torch.Tensor, kv_len: int | None) -> torch.Tensor:
        """k, v [B, T, Hkv, Dh] into the cache at input_pos [B, T], then q [B, T, H, Dh] over the
        slots' first kv_len rows -> [B, T, H, Dh]: the backbone's (GatedAttention.attend_cache),
        which the fast path's `cache_attention` kernel replaces for one-row calls (fast.py)."""
        assert self.kv_cache is not None, "setup_caches allocates the cache"
        keys, values = self.kv_cache.update(k, v, input_pos, slots, kv_len)
        return attend(q, keys, values, input_pos)


class FeedForward(nn.Module):
    projections = ("w1", "w3")  # the linears of `project`, in its order

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> gate and up [B, T, hidden] (one GEMM once fused)."""
        return self.w1(x), self.w3(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.project(x)
        y: torch.Tensor = self.w2(F.silu(gate) * up)
        return y


class TowerBlock(nn.Module):
    """`transformer_layer` of a tower layer: a pre-norm attention + SwiGLU block."""

    def __init__(self, config: TowerConfig) -> None:
        super().__init__()
        self.attention = TowerAttention(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config.dim, config.intermediate_size)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
                kv_len: int | None) -> torch.Tensor:
        normed, x = self.ffn_norm.add(x, self.attention(self.attention_norm(x), rope, input_pos, slots, kv_len))
        y: torch.Tensor = x + self.feed_forward(normed)
        return y


class TowerLayer(nn.Module):
    rope: torch.Tensor  # [max_rows, 2, rot/2] float32, made by Tower.setup_caches

    def __init__(self, config: TowerConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.dim)
        self.enorm = RMSNorm(config.dim, config.norm_eps)
        self.hnorm = RMSNorm(config.dim, config.norm_eps)
        self.eh_proj = nn.Linear(2 * config.dim, config.dim, bias=False)
        self.transformer_layer = TowerBlock(config)
        self.final_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.register_buffer("rope", None, persistent=False)  # shared by the tower's layers

    def forward(self, hidden: torch.Tensor, codes: torch.Tensor, semantic: torch.Tensor,
                input_pos: torch.Tensor, slots: torch.Tensor, kv_len: int | None = None,
                extra: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [B, T, D] (or [B, D]), codes, semantic (the label is semantic), input_pos [B, T]
        (or [B]), slots [B]; extra [B, T, D] is added to the code embedding -> [B, T, D] (or [B, D])."""
        rows = hidden.dim() == 2
        if rows:  # one row per slot: the same maths with T = 1
            hidden, codes, semantic, input_pos = hidden[:, None], codes[:, None], semantic[:, None], input_pos[:, None]
            extra = None if extra is None else extra[:, None]
        e = self.embedding(codes.clamp(0, self.embedding.num_embeddings - 1))  # [B, T, D]
        e = torch.where(semantic[..., None], e, torch.zeros_like(e))
        if extra is not None:
            e = e + extra.to(e.dtype)
        x = self.eh_proj(torch.cat((self.enorm(e), self.hnorm(hidden)), dim=-1))
        rope = self.rope[input_pos]  # [B, T, 2, rot/2]
        out: torch.Tensor = self.final_layernorm(self.transformer_layer(x, rope, input_pos, slots, kv_len))
        return out[:, 0] if rows else out


class Tower(nn.Module):
    def __init__(self, config: Drama3Config) -> None:
        super().__init__()
        c = self.config = config.tower
        self.semantic_start, self.semantic_end = config.semantic_start_token_id, config.semantic_end_token_id
        self.codebook_size, self.num_codebooks = c.vocab_size, c.num_codebooks
        self.backbone_codebooks = c.vq_backbone_codebooks  # K_b
        # One table for all codebooks: codebook k uses rows k * codebook_size + code.
        self.codebook_embeddings = nn.Embedding(c.num_codebooks * c.vocab_size, c.dim)
        self.shared_layers = nn.ModuleList(TowerLayer(c) for _ in range(c.n_layer))
        self.residual_layers = nn.ModuleList(TowerLayer(c) for _ in range(c.residual_layers))
        self.heads = nn.ModuleList(nn.Linear(c.dim, c.vocab_size, bias=False) for _ in range(c.residual_layers))

    def setup_caches(self, slots: int, max_rows: int, device: torch.device | str, dtype: torch.dtype) -> None:
        c = self.config
        rope = rope_table(max_rows, c.rotary_dim, c.rope_base, device)
        for layer in (*self.shared_layers, *self.residual_layers):
            layer.transformer_layer.attention.kv_cache = KVCache(slots, max_rows, c.n_local_heads, c.head_dim,
                                                                 device, dtype)
            layer.rope = rope

    def is_semantic(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens >= self.semantic_start) & (tokens <= self.semantic_end)

    def codebook_sum(self, frames: torch.Tensor, first: int, end: int) -> torch.Tensor:
        """Sum of the embeddings of codebooks first..end-1 of frames [..., 11] -> [..., D]."""
        offsets = torch.arange(first, end, device=frames.device) * self.codebook_size
        codes = frames[..., 1 + first:1 + end].clamp(0, self.codebook_size - 1) + offsets  # [..., end-first]
        embeddings: torch.Tensor = self.codebook_embeddings(codes)  # [..., end-first, D]
        return embeddings.sum(-2)

    def embed_backbone(self, frames: torch.Tensor, token_embeds: torch.Tensor) -> torch.Tensor:
        """Backbone input: semantic rows add codebooks 1..K_b to the token embedding and scale by 1/sqrt(1+K_b)."""
        mixed = (token_embeds + self.codebook_sum(frames, 1, 1 + self.backbone_codebooks).to(token_embeds.dtype)) \
            * (1.0 + self.backbone_codebooks) ** -0.5
        return torch.where(self.is_semantic(frames[..., 0])[..., None], mixed, token_embeds)

    def shared_input(self, frames: torch.Tensor) -> torch.Tensor:
        """The first shared layer's extra input: codebooks K_b+1..9 of semantic input frames."""
        unseen = self.codebook_sum(frames, 1 + self.backbone_codebooks, self.num_codebooks)
        return torch.where(self.is_semantic(frames[..., 0])[..., None], unseen, torch.zeros_like(unseen))

    def run_shared(self, hidden: torch.Tensor, code0: torch.Tensor, semantic: torch.Tensor, frames: torch.Tensor,
                   input_pos: torch.Tensor, slots: torch.Tensor, kv_len: int | None = None) -> torch.Tensor:
        """The shared layers over backbone hidden [B, (T,) D]; frames are the backbone's input frames."""
        extra = self.shared_input(frames)
        for index, layer in enumerate(self.shared_layers):
            hidden = layer(hidden, code0, semantic, input_pos, slots, kv_len, extra if index == 0 else None)
        return hidden

    def prefill(self, hidden: torch.Tensor, input_pos: torch.Tensor, frames: torch.Tensor,
                next_frames: torch.Tensor, slots: torch.Tensor, kv_len: int | None = None) -> None:
        """Teacher-force the tower caches over prompt rows: hidden [B, T, D] of frames [B, T, 11],
        labelled by next_frames [B, T, 11] (row p + 1 of the prompt)."""
        semantic = self.is_semantic(next_frames[..., 0])
        hidden = self.run_shared(hidden, next_frames[..., 1], semantic, frames, input_pos, slots, kv_len)
        for j, layer in enumerate(self.residual_layers):
            hidden = layer(hidden, next_frames[..., 1 + j], semantic, input_pos, slots, kv_len)

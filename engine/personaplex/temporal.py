"""Helium, the temporal transformer: summed token embeddings in, hidden state and text logits out.

Design choices:
- Module and parameter names are the checkpoint keys (`text_emb`, `emb.{k}`,
  `transformer.layers.{i}.self_attn.in_proj_weight`, `...gating.linear_in`, `norm1.alpha`,
  `out_norm`, `text_linear`), so loading is `load_state_dict`.
- `embed(tokens)` is the frame input: `text_emb(row 0) + sum_k emb[k](row k+1)`, the audio
  rows summed first as Moshi does; a token of -1 gives a zero vector (Moshi's `zero_idx`).
  It is a separate call so a caller can replace a row's input by a stored voice-prompt
  embedding.
- `forward(x, positions, rows)` is one function for every phase: the caller owns the
  positions (a reset row restarts at -1) and says which slots run (`rows`: a tick's
  batch bucket, or the one slot whose system prompt is being read); the keys and values
  go to a static per-slot ring (`setup_streams`, streaming.py; ring.py), whose mask and
  rope tables are computed once per call for all layers. `trunk` is the same without
  the text head, for system prompts, whose text is forced.
- Pre-norm layers, RMSNorm in fp32, interleaved RoPE, gated SiLU MLP, no biases, no layer
  scale; `out_norm` then the text head.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.personaplex.config import LMConfig
from engine.personaplex.layers import GatedMLP, RMSNorm
from engine.personaplex.ring import RingAttention, RingStep, ring_step
from engine.personaplex.streaming import StreamingModule


def embed_rows(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Embedding lookup where -1 gives zeros (and other values are clamped to >= 0)."""
    out = F.embedding(tokens.clamp(min=0), table)
    return torch.where((tokens == -1)[..., None], torch.zeros((), dtype=out.dtype, device=out.device), out)


class Layer(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim)
        self.self_attn = RingAttention(cfg.dim, cfg.num_heads, cfg.context)
        self.norm2 = RMSNorm(cfg.dim)
        self.gating = GatedMLP(cfg.dim, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, step: RingStep) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x), step)
        out: torch.Tensor = x + self.gating(self.norm2(x))
        return out


class Stack(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))


class Temporal(StreamingModule):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.text_emb = nn.Embedding(cfg.text_card + 1, cfg.dim)
        self.emb = nn.ModuleList(nn.Embedding(cfg.card + 1, cfg.dim) for _ in range(cfg.n_q))
        self.transformer = Stack(cfg)
        self.out_norm = RMSNorm(cfg.dim)
        self.text_linear = nn.Linear(cfg.dim, cfg.text_card, bias=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, K] (text, agent codebooks, user codebooks) -> the frame input [B, 1, D]."""
        tables = [cast(nn.Embedding, emb).weight for emb in self.emb]  # n_q x [card + 1, D]
        x = embed_rows(tables[0], tokens[:, 1])
        for k in range(1, self.cfg.n_q):
            x = x + embed_rows(tables[k], tokens[:, k + 1])
        x = x + embed_rows(self.text_emb.weight, tokens[:, 0])
        return x[:, None]

    def rings(self) -> list[RingAttention]:
        """Each layer's attention (its key/value ring)."""
        return [cast(Layer, layer).self_attn for layer in self.transformer.layers]

    def trunk(self, x: torch.Tensor, positions: torch.Tensor, rows: slice | None = None,
              active: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] at positions [B, T] of the slots `rows` (default the first B) -> the last layer's [B, T, D];
        `active` [B]: the rows whose output is kept (the fused attention skips the others)."""
        cfg = self.cfg
        step = ring_step(positions, cfg.context, cfg.context, cfg.dim // cfg.num_heads, cfg.max_period, rows, active)
        for layer in self.transformer.layers:
            x = layer(x, step)
        return x

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rows: slice | None = None,
                active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, D] at positions [B, T] -> (hidden [B, T, D] after out_norm, text logits [B, T, text_card])."""
        hidden = self.out_norm(self.trunk(x, positions, rows, active))
        return hidden, self.text_linear(hidden)

"""The depformer: one small causal transformer pass per frame over the audio codebooks.

Design choices:
- Names are the checkpoint keys (`depformer_in.{t}`, `linears.{t}`, `depformer_text_emb`,
  `depformer_emb.{t}`, `depformer.layers.{l}.self_attn.in_proj_weight` with the per-step
  weights stacked on rows, `...gating.{t}.linear_in`), after the 8 -> 16 expansion done by
  the loader (checkpoint.py), so every step t has its own weights.
- Step t reads the temporal hidden state through `depformer_in[t]` plus the embedding of
  the previous token: the text token at t = 0, codebook t-1 after. Teacher forcing: where
  the staging ring already holds a provided value for codebook t, that value (not the
  sampled one) is the next step's input; the sampled codes are returned either way and the
  caller keeps the provided ones (PP-lm `depformer_step`).
- The keys and values span only the steps of the current frame: a static buffer per slot
  (`setup_streams`, streaming.py), written at step t and read up to t, so no mask, no
  positional embedding (`depformer_pos_emb` "none") and nothing to reset.
- Sampling is a function of (logits, step) passed in (sampling.py), because each step's
  code is the next step's input.
- A call of B rows uses the first B slots' key/value scratch (a batch bucket).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.personaplex.config import LMConfig
from engine.personaplex.layers import GatedMLP, RMSNorm
from engine.personaplex.streaming import StreamingModule
from engine.personaplex.temporal import embed_rows


class StepAttention(StreamingModule):
    keys: torch.Tensor  # [B, heads, steps, head_dim]: this frame's steps so far
    values: torch.Tensor

    def __init__(self, dim: int, num_heads: int, steps: int):
        super().__init__()
        self.num_heads = num_heads
        self.steps = steps
        self.in_proj_weight = nn.Parameter(torch.empty(steps * 3 * dim, dim))  # [steps * 3D, D]
        self.out_proj = nn.Linear(dim, steps * dim, bias=False)  # weight [steps * D, D]
        self.register_buffer("keys", torch.zeros(0), persistent=False)
        self.register_buffer("values", torch.zeros(0), persistent=False)

    def _setup_stream(self, batch: int) -> None:
        dim = self.in_proj_weight.shape[1]
        w = self.in_proj_weight
        shape = (batch, self.num_heads, self.steps, dim // self.num_heads)
        self.keys = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.values = torch.zeros(shape, dtype=w.dtype, device=w.device)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        B, _, D = x.shape
        w_in = self.in_proj_weight.view(self.steps, 3 * D, D)[step]
        w_out = self.out_proj.weight.view(self.steps, D, D)[step]
        q, k, v = F.linear(x, w_in).view(B, 3, self.num_heads, 1, D // self.num_heads).unbind(1)  # [B, H, 1, Dh]
        keys, values = self.keys[:B, :, :step + 1], self.values[:B, :, :step + 1]  # a batch bucket: the first B
        keys[:, :, step:] = k
        values[:, :, step:] = v
        out = F.scaled_dot_product_attention(q, keys, values)
        return F.linear(out.transpose(1, 2).reshape(B, 1, D), w_out)


class StepLayer(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        dim, steps = cfg.depformer_dim, cfg.depformer_steps
        self.norm1 = RMSNorm(dim)
        self.self_attn = StepAttention(dim, cfg.depformer_num_heads, steps)
        self.norm2 = RMSNorm(dim)
        self.gating = nn.ModuleList(GatedMLP(dim, cfg.depformer_ffn_hidden) for _ in range(steps))

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x), step)
        out: torch.Tensor = x + self.gating[step](self.norm2(x))
        return out


class StepStack(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.layers = nn.ModuleList(StepLayer(cfg) for _ in range(cfg.depformer_num_layers))


class Depformer(StreamingModule):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        steps, dim = cfg.depformer_steps, cfg.depformer_dim
        self.steps = steps
        self.depformer_in = nn.ModuleList(nn.Linear(cfg.dim, dim, bias=False) for _ in range(steps))
        self.depformer_text_emb = nn.Embedding(cfg.text_card + 1, dim)
        self.depformer_emb = nn.ModuleList(nn.Embedding(cfg.card + 1, dim) for _ in range(steps - 1))
        self.depformer = StepStack(cfg)
        self.linears = nn.ModuleList(nn.Linear(dim, cfg.card, bias=False) for _ in range(steps))

    def forward(self, hidden: torch.Tensor, text: torch.Tensor, targets: torch.Tensor, provided: torch.Tensor,
                sample: Callable[[torch.Tensor, int], torch.Tensor], steps: int | None = None) -> torch.Tensor:
        """hidden [B, 1, D], text [B], targets/provided [B, all steps] -> sampled codes [B, steps].

        `sample` maps logits [B, card] (fp32) and the step to tokens [B]. `steps` runs only the first
        steps (the depformer is causal over steps, so they do not depend on the later ones).
        """
        codes = []
        previous = text
        for t in range(self.steps if steps is None else steps):
            table = self.depformer_text_emb.weight if t == 0 else cast(nn.Embedding, self.depformer_emb[t - 1]).weight
            x = self.depformer_in[t](hidden) + embed_rows(table, previous)[:, None]  # [B, 1, dim]
            for layer in self.depformer.layers:
                x = layer(x, t)
            token = sample(self.linears[t](x)[:, 0].float(), t)
            codes.append(token)
            previous = torch.where(provided[:, t], targets[:, t], token)
        return torch.stack(codes, dim=1)

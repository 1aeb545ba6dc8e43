"""Drama3Model: the backbone, the tower and the candidate head, as the generation loop uses them.

    model.setup_caches(slots, max_rows, device, dtype)     # static caches of every layer
    cache_bytes(config, max_rows, dtype)                  # what one slot of them holds
    embeds = model.embed(frames)                          # frames int64 [B, T, 11] -> [B, T, D]
    hidden = model.backbone(embeds, input_pos, slots, kv_len)   # [B, T, D], final-normed; prefill or decode
    logits = model.candidate_logits(hidden)               # [..., 4097] float32: EOS + the semantic band
    model.tower.prefill(hidden, input_pos, frames, next_frames, slots)
    h = model.tower.run_shared(hidden, code0, semantic, frames, input_pos, slots, kv_len)
    h = model.tower.residual_layers[j](h, code_j, semantic, input_pos, slots, kv_len); model.tower.heads[j](h)

Every attention call (backbone and tower) takes an optional `kv_len`: it attends over the
first kv_len cache rows of its slots (a static bucket >= max(input_pos) + 1; None = all
max_rows). On CPU it is what keeps a decode step cheap with a large cache.

Design choices:
- Only the lm_head rows that can be sampled are kept: `candidate_ids` (EOS and the
  semantic band, sorted; 4,097 ids) and `candidate_head` [4097, D], filled by the loader
  straight from the checkpoint's `lm_head.weight` rows. The full head is never built.
- The model is built in its dtype (float32 on CPU, bfloat16 on GPU) on the meta device
  and filled by checkpoint.py. Move it with `.to(device)` only: `.to(dtype)` would also
  cast the FP8 expert buffers. DeltaNet decay parameters and FP8 scales stay float32.
- No phase, graph or batching logic here: slots and positions are inputs, caches are
  preallocated by `setup_caches` (call it again to resize; it drops the caches' contents).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.drama3.backbone import Backbone
from engine.drama3.config import Drama3Config
from engine.drama3.tower import Tower


def candidate_ids(config: Drama3Config) -> torch.Tensor:
    """EOS and the semantic band, sorted: the main-token ids the sampler draws from."""
    band = torch.arange(config.semantic_start_token_id, config.semantic_end_token_id + 1)
    return torch.cat((torch.tensor([config.eos_token_id]), band)).sort().values


def cache_bytes(config: Drama3Config, max_rows: int, dtype: torch.dtype) -> int:
    """The bytes `setup_caches` allocates per slot: the KV rows (and KVCache's spare row) of
    every backbone attention and tower layer, and each Gated DeltaNet layer's recurrent
    (float32) and conv states."""
    text, tower = config.text, config.tower
    size = torch.empty(0, dtype=dtype).element_size()
    kv = len(text.full_attention_layers) * text.num_key_value_heads * text.head_dim \
        + (tower.n_layer + tower.residual_layers) * tower.n_local_heads * tower.head_dim
    conv_channels = 2 * text.linear_key_dim + text.linear_value_dim
    deltanet = text.linear_num_value_heads * text.linear_key_head_dim * text.linear_value_head_dim * 4 \
        + conv_channels * (text.linear_conv_kernel_dim - 1) * size
    return 2 * kv * (max_rows + 1) * size + len(text.linear_attention_layers) * deltanet


class Drama3Model(nn.Module):
    candidate_ids: torch.Tensor  # [4097] int64
    candidate_head: torch.Tensor  # [4097, D]

    def __init__(self, config: Drama3Config) -> None:
        super().__init__()
        self.config = config
        self.backbone = Backbone(config.text, config.fp8_experts)
        self.tower = Tower(config)
        rows = config.codebook_size + 1
        self.register_buffer("candidate_ids", torch.zeros(rows, dtype=torch.long), persistent=False)
        self.register_buffer("candidate_head", torch.zeros(rows, config.text.hidden_size))  # lm_head rows

    def init_buffers(self) -> None:
        """Fill the buffers that do not come from the checkpoint (after `to_empty`)."""
        self.candidate_ids.copy_(candidate_ids(self.config))

    def setup_caches(self, slots: int, max_rows: int, device: torch.device | str, dtype: torch.dtype) -> None:
        """Allocate the static caches of every backbone and tower layer: `slots` takes of `max_rows` rows."""
        if max_rows > self.config.text.max_position_embeddings:
            raise ValueError(f"max_rows={max_rows} exceeds max_position_embeddings="
                             f"{self.config.text.max_position_embeddings}")
        self.backbone.setup_caches(slots, max_rows, device, dtype)
        self.tower.setup_caches(slots, max_rows, device, dtype)

    def embed(self, frames: torch.Tensor) -> torch.Tensor:
        """frames int64 [B, T, 11] -> backbone input [B, T, D]."""
        return self.tower.embed_backbone(frames, self.backbone.embed_tokens(frames[..., 0]))

    def candidate_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] -> float32 logits [..., 4097] of `candidate_ids`."""
        return F.linear(hidden, self.candidate_head).float()

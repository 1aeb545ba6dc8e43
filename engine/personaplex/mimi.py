"""Mimi, streamed one 80 ms frame at a time for B slots: 1920 samples <-> 8 codes per row.

Design choices:
- Encode: SEANet encoder (25 Hz) -> transformer -> learnt stride-2 conv to 12.5 Hz ->
  split RVQ (1 semantic codebook + the first acoustic ones). Decode is the mirror: RVQ
  sum -> channel-wise stride-2 transposed conv -> transformer -> SEANet decoder (moshi
  `models/compression.py`, `get_mimi`).
- All state is per slot and static (streaming.py): conv contexts, the transformers'
  key/value rings (context 250 positions, two positions a frame) and their positions.
  `reset_streams(rows)` gives chosen rows a fresh stream while the others keep theirs;
  `encode` and `decode` have independent state (a slot is reset for both at once). A
  call of B rows runs the first B slots (a batch bucket): every module slices its state.
- The transformers' parameters follow the checkpoint keys once `.transformer.` is dropped
  (`encoder_transformer.layers.{i}.self_attn.in_proj_weight`, `norm1.weight`,
  `layer_scale_1.scale`, `linear1.weight`...). The codebooks are computed at load from the
  EMA sums (`embedding_sum / cluster_usage`), as Moshi's `EuclideanCodebook` does.
- Mimi runs in float32 whatever the LM dtype, as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.personaplex.config import MimiConfig
from engine.personaplex.ring import RingAttention, RingStep, ring_step
from engine.personaplex.seanet import SEANetDecoder, SEANetEncoder, StreamingConv1d, StreamingConvTranspose1d
from engine.personaplex.streaming import StreamingModule


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class MimiLayer(nn.Module):
    def __init__(self, cfg: MimiConfig):
        super().__init__()
        d = cfg.d_model
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.self_attn = RingAttention(d, cfg.num_heads, cfg.context, clear_on_reset=True)
        self.layer_scale_1 = LayerScale(d, cfg.layer_scale)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.linear1 = nn.Linear(d, cfg.dim_feedforward, bias=False)
        self.linear2 = nn.Linear(cfg.dim_feedforward, d, bias=False)
        self.layer_scale_2 = LayerScale(d, cfg.layer_scale)

    def forward(self, x: torch.Tensor, step: RingStep) -> torch.Tensor:
        x = x + self.layer_scale_1(self.self_attn(self.norm1(x), step))
        out: torch.Tensor = x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))
        return out


LayerFn = Callable[[MimiLayer, torch.Tensor, RingStep], torch.Tensor]  # how a transformer runs one of its layers


def run_layer(layer: MimiLayer, h: torch.Tensor, step: RingStep) -> torch.Tensor:
    """The layer's own forward (compiled_mimi.py gives the compiled one)."""
    out: torch.Tensor = layer(h, step)
    return out


class MimiTransformer(StreamingModule):
    """Causal transformer over the 25 Hz latents, conv layout [B, C, T] in and out."""

    offset: torch.Tensor  # [B] each row's next position

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.context = cfg.context
        self.head_dim = cfg.d_model // cfg.num_heads
        self.max_period = cfg.max_period
        self.layers = nn.ModuleList(MimiLayer(cfg) for _ in range(cfg.num_layers))
        self.register_buffer("offset", torch.zeros(0, dtype=torch.long), persistent=False)

    def _setup_stream(self, batch: int) -> None:
        self.offset = torch.zeros(batch, dtype=torch.long, device=next(self.parameters()).device)

    def _reset_stream(self, rows: torch.Tensor) -> None:
        self.offset.masked_fill_(rows, 0)

    def forward(self, x: torch.Tensor, layer: LayerFn = run_layer) -> torch.Tensor:
        B, _, T = x.shape
        offset = self.offset[:B]  # a batch bucket runs the first B slots
        positions = offset[:, None] + torch.arange(T, device=x.device)  # [B, T]
        step = ring_step(positions, self.context, self.context, self.head_dim, self.max_period)
        h = x.transpose(1, 2)
        for module in self.layers:
            h = layer(cast(MimiLayer, module), h, step)
        offset.copy_(self.kept(offset + T, offset))
        return h.transpose(1, 2)


class RVQ(nn.Module):
    """Residual VQ with its own 1x1 input and output projections (one half of the split RVQ)."""

    codebooks: torch.Tensor  # [codebooks, bins, codebook_dim]

    def __init__(self, dimension: int, codebook_dim: int, codebooks: int, bins: int):
        super().__init__()
        self.input_proj = nn.Conv1d(dimension, codebook_dim, 1, bias=False)
        self.output_proj = nn.Conv1d(codebook_dim, dimension, 1, bias=False)
        self.register_buffer("codebooks", torch.zeros(codebooks, bins, codebook_dim))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, dimension, 1] -> codes [B, codebooks]."""
        residual = self.input_proj(x)[:, :, 0]  # [B, codebook_dim]
        codes = []
        for table in self.codebooks:
            code = torch.cdist(residual[None], table[None], p=2)[0].argmin(dim=-1)  # [B]
            residual = residual - F.embedding(code, table)
            codes.append(code)
        return torch.stack(codes, dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, codebooks] -> [B, dimension, 1]."""
        quantized = F.embedding(codes[:, 0], self.codebooks[0])
        for i in range(1, codes.shape[1]):
            quantized = quantized + F.embedding(codes[:, i], self.codebooks[i])
        out: torch.Tensor = self.output_proj(quantized[:, :, None])
        return out


class SplitRVQ(nn.Module):
    """One semantic codebook (`rvq_first`) plus acoustic ones (`rvq_rest`), each from the same latent."""

    def __init__(self, cfg: MimiConfig, codebooks: int):
        super().__init__()
        self.rvq_first = RVQ(cfg.dimension, cfg.codebook_dim, 1, cfg.bins)
        self.rvq_rest = RVQ(cfg.dimension, cfg.codebook_dim, codebooks - 1, cfg.bins)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.rvq_first.encode(x), self.rvq_rest.encode(x)], dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class Mimi(StreamingModule):
    def __init__(self, cfg: MimiConfig, codebooks: int):
        super().__init__()
        self.cfg = cfg
        self.codebooks = codebooks
        stride = cfg.downsample
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = MimiTransformer(cfg)
        self.downsample = StreamingConv1d(cfg.dimension, cfg.dimension, 2 * stride, stride, bias=False, replicate=True)
        self.quantizer = SplitRVQ(cfg, codebooks)
        # Channel-wise (groups = dimension): Moshi's `upsample_channel_wise_bug`, kept by the released weights.
        self.upsample = StreamingConvTranspose1d(cfg.dimension, cfg.dimension, 2 * stride, stride,
                                                 groups=cfg.dimension, bias=False)
        self.decoder_transformer = MimiTransformer(cfg)
        self.decoder = SEANetDecoder(cfg)

    @property
    def frame_size(self) -> int:
        return self.cfg.frame_size

    def sharing_weights(self) -> Mimi:
        """Another Mimi on the same parameters, with streams of its own."""
        with torch.device("meta"):
            twin = Mimi(self.cfg, self.codebooks)
        twin.load_state_dict(self.state_dict(), strict=True, assign=True)
        return twin.eval()

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, layer: LayerFn = run_layer) -> torch.Tensor:
        """pcm [B, frame_size] float -> codes [B, codebooks] (long); `layer` runs each transformer layer."""
        x = self.encoder(pcm[:, None, :].float())  # [B, dimension, frame_size / hop]
        x = self.downsample(self.encoder_transformer(x, layer))  # [B, dimension, 1]
        return self.quantizer.encode(x)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, layer: LayerFn = run_layer) -> torch.Tensor:
        """codes [B, codebooks] (valid codes only: < bins) -> pcm [B, frame_size] float32."""
        x = self.upsample(self.quantizer.decode(codes))  # [B, dimension, frame_size / hop]
        out: torch.Tensor = self.decoder(self.decoder_transformer(x, layer))[:, 0]
        return out


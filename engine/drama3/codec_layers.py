"""The modules of Fish's modified DAC codec (`modded_dac_vq`), named after codec.pth keys.

Design choices:
- Module attribute names and `nn.Sequential` indices follow the released state dict
  (`encoder.block.1.block.0.block.1.conv.weight`, `quantizer.post_module.layers.3.attention.wqkv`),
  so loading is `load_state_dict` after one rename: weight norm is folded at load
  (codec.py), and these modules only ever hold plain `weight` tensors. `weight_norm`
  on a conv records how the checkpoint stores it, for the tiny checkpoint writer.
- Everything is causal: a convolution pads on the left only, a transposed convolution
  trims its right overhang, attention sees a causal window. Output for frame t depends
  only on frames <= t, which is what lets a take stream window by window (codec_stream.py).
- Numerics follow the release where they matter for parity: the vector quantiser picks
  codes by cosine similarity (the transformers' own: codec_transformer.py).
- Outside the post transformer, everything is a short causal convolution: `conv_context`
  counts how many frames back they reach (about 9 at the release's rates), which is all
  the context the upsampling and the decoder need (codec.py `decode_tail`, codec_stream.py).
- Batch size is whatever the caller gives (codec.py decodes one clip, or windows of several
  takes at once); no op mixes the clips of a batch.
- The decoder's Snakes run as one Triton pass each on a GPU (`inverse`, set by codec.py `ready`;
  engine/kernels/snake.py): eager torch ran eight kernels over the activation per Snake, 5.3
  of a long window's 14.6 ms on an H100. Two other forms of the convolutions' sums were tried
  there and dropped (stop 37, docs/perf.md): the dilated ones folded into undilated ones over
  interleaved rows, and each as one matrix product over its unfolded taps; cuDNN's own were
  as fast or faster at a window's shapes.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.drama3.codec_transformer import Memory, WindowLimitedTransformer
from engine.kernels.fallback import guarded
from engine.kernels.snake import snake_kernel, snake_reference

ENCODER_WINDOW = 512  # the release's encoder transformers always attend 512 latent steps


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel (DAC's Snake1d)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        # Set by codec.py `ready` on a GPU: the Snake runs as one Triton pass (engine/kernels/snake.py)
        # with this, the kernel's 1 / (alpha + 1e-9) [C]; None: the layer's own arithmetic.
        self.inverse: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        # In float32 with float32 alphas, rounded once, as SGLang Omni's float16 decoder
        # computes it (a Triton kernel); per-op float16 loses ~1 dB against float32.
        if self.inverse is not None and not torch.compiler.is_compiling():  # (compiled: Inductor fuses the reference)
            return guarded("codec snake", snake_kernel, snake_reference, x, self.alpha, self.inverse)
        return snake_reference(x, self.alpha)


class CausalConv(nn.Module):
    """Conv1d padded on the left by (kernel - stride), and on the right up to a whole stride."""

    def __init__(self, channels_in: int, channels_out: int, kernel_size: int, stride: int = 1,
                 dilation: int = 1, groups: int = 1, weight_norm: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels_in, channels_out, kernel_size, stride=stride,
                              dilation=dilation, groups=groups)
        self.stride = stride
        self.left = (kernel_size - 1) * dilation + 1 - stride
        self.weight_norm = weight_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, C', ceil(T / stride)]
        right = -x.shape[-1] % self.stride
        if self.left or right:
            x = F.pad(x, (self.left, right))
        out: torch.Tensor = self.conv(x)
        return out


class CausalConvTranspose(nn.Module):
    """ConvTranspose1d whose right overhang (kernel - stride samples) is dropped."""

    def __init__(self, channels_in: int, channels_out: int, kernel_size: int, stride: int,
                 weight_norm: bool = True) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(channels_in, channels_out, kernel_size, stride=stride)
        self.trim = kernel_size - stride
        self.weight_norm = weight_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, C', T * stride]
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.trim] if self.trim else x


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake(channels), CausalConv(channels, channels, 7, dilation=dilation),
            Snake(channels), CausalConv(channels, channels, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.block(x)
        return out


def conv_context(modules: list[nn.Module], rate: int = 1) -> float:
    """Frames back that the causal convolutions of `modules` (run in this order on an input of
    `rate` samples a frame) reach: an output depends on inputs no further back. Receptive
    fields add along a chain; a residual adds none; a transposed convolution whose kernel
    overhangs its stride reads one more input step, then multiplies the rate."""
    frames = 0.0
    for module in modules:
        for part in module.modules():
            if isinstance(part, CausalConv):
                frames += part.left / rate
            elif isinstance(part, CausalConvTranspose):
                stride = int(part.conv.stride[0])
                frames += -(-part.trim // stride) / rate
                rate *= stride
    return frames


# ─── Encoder and decoder ──────────────────────────────────────────────────────


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, transformer: nn.Module | None) -> None:
        super().__init__()
        half = dim // 2
        parts = [ResidualUnit(half, 1), ResidualUnit(half, 3), ResidualUnit(half, 9),
                 Snake(half), CausalConv(half, dim, 2 * stride, stride=stride)]
        self.block = nn.Sequential(*parts, *([transformer] if transformer is not None else []))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(x)
        return out


class Encoder(nn.Module):
    """Waveform [B, 1, S] -> latent [B, latent_dim, S / prod(rates)]."""

    def __init__(self, dim: int, rates: list[int], latent_dim: int, transformer_layers: list[int],
                 general: dict[str, Any]) -> None:
        super().__init__()
        blocks: list[nn.Module] = [CausalConv(1, dim, 7)]
        for stride, layers in zip(rates, transformer_layers):
            dim *= 2
            transformer = None
            if layers:
                # The release sizes these from the width alone: dim / 64 heads of
                # general["head_dim"], a 3x feed-forward, a 512-step window.
                transformer = WindowLimitedTransformer(
                    dim, dim, layers, dim // 64, general["head_dim"], dim * 3, ENCODER_WINDOW,
                    general["rope_base"], general["norm_eps"])
            blocks.append(EncoderBlock(dim, stride, transformer))
        blocks += [Snake(dim), CausalConv(dim, latent_dim, 3)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(x)
        return out


class DecoderBlock(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake(dim_in), CausalConvTranspose(dim_in, dim_out, 2 * stride, stride),
            ResidualUnit(dim_out, 1), ResidualUnit(dim_out, 3), ResidualUnit(dim_out, 9),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(x)
        return out


class Decoder(nn.Module):
    """Latent [B, latent_dim, L] -> waveform [B, 1, L * prod(rates)] in (-1, 1).

    The release builds a transformer for decoder_transformer_layers but never wires it
    in (it is commented out of DecoderBlock), so those layers do not exist here either.
    """

    def __init__(self, latent_dim: int, dim: int, rates: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(latent_dim, dim, 7)]
        for i, stride in enumerate(rates):
            layers.append(DecoderBlock(dim // 2**i, dim // 2 ** (i + 1), stride))
        out = dim // 2 ** len(rates)
        layers += [Snake(out), CausalConv(out, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x)
        return out


# ─── Quantiser ────────────────────────────────────────────────────────────────


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv -> LayerNorm -> 4x MLP (GELU) -> layer scale, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim, weight_norm=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        y = self.norm(self.dwconv(x).transpose(1, 2))  # [B, T, C]
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))
        out: torch.Tensor = x + y.transpose(1, 2)
        return out


class VectorQuantizer(nn.Module):
    """One codebook: project to codebook_dim, nearest code by cosine, project back."""

    legacy_weight_norm = ("in_proj", "out_proj")  # stored as DAC's old weight_g / weight_v keys

    def __init__(self, dim: int, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.in_proj = nn.Conv1d(dim, codebook_dim, 1)
        self.out_proj = nn.Conv1d(codebook_dim, dim, 1)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes [B, T] of z [B, C, T] and their embedding [B, C, T]."""
        projected = self.in_proj(z)  # [B, d, T]
        e = F.normalize(projected.transpose(1, 2).flatten(0, 1))  # [B*T, d]
        c = F.normalize(self.codebook.weight)  # [N, d]
        distance = e.pow(2).sum(1, keepdim=True) - 2 * e @ c.t() + c.pow(2).sum(1, keepdim=True).t()
        codes = (-distance).max(1).indices.view(z.shape[0], z.shape[2])
        chosen = F.embedding(codes, self.codebook.weight).transpose(1, 2)  # [B, d, T]
        # DAC's straight-through form: numerically projected + (chosen - projected), not
        # chosen; kept so the residuals (and so later codebooks' codes) match the release.
        embedding: torch.Tensor = self.out_proj(projected + (chosen - projected))  # [B, C, T]
        return codes, embedding

    def embed(self, codes: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, C, T]
        out: torch.Tensor = self.out_proj(F.embedding(codes, self.codebook.weight).transpose(1, 2))
        return out


class ResidualQuantizer(nn.Module):
    def __init__(self, dim: int, n_codebooks: int, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.codebook_size = codebook_size
        self.quantizers = nn.ModuleList(VectorQuantizer(dim, codebook_size, codebook_dim)
                                        for _ in range(n_codebooks))

    def encode(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes [B, N, T] of z [B, C, T] and the quantised sum [B, C, T]."""
        codes, total, residual = [], torch.zeros_like(z), z
        for quantizer in self.vector_quantizers():
            indices, step = quantizer.quantize(residual)
            total, residual = total + step, residual - step
            codes.append(indices)
        return torch.stack(codes, 1), total

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, N, T] -> [B, C, T]
        first, *rest = [q.embed(codes[:, i]) for i, q in enumerate(self.vector_quantizers())]
        for embedding in rest:  # summed in codebook order
            first = first + embedding
        return first

    def vector_quantizers(self) -> list[VectorQuantizer]:
        return [cast(VectorQuantizer, q) for q in self.quantizers]


class DownsampleQuantizer(nn.Module):
    """latent (x4 frames) -> downsample -> pre transformer -> semantic + residual codes;
    codes -> sum of embeddings -> post transformer -> upsample -> latent."""

    def __init__(self, dim: int, n_codebooks: int, codebook_size: int, codebook_dim: int,
                 semantic_codebook_size: int, factors: list[int], dims: list[int],
                 pre_module: WindowLimitedTransformer, post_module: WindowLimitedTransformer) -> None:
        super().__init__()
        all_dims = [dim, *dims]
        self.semantic_quantizer = ResidualQuantizer(dim, 1, semantic_codebook_size, codebook_dim)
        self.quantizer = ResidualQuantizer(dim, n_codebooks, codebook_size, codebook_dim)
        self.downsample = nn.Sequential(*(
            nn.Sequential(CausalConv(all_dims[i], all_dims[i + 1], f, stride=f, weight_norm=False),
                          ConvNeXtBlock(all_dims[i + 1]))
            for i, f in enumerate(factors)))
        self.upsample = nn.Sequential(*(
            nn.Sequential(CausalConvTranspose(all_dims[i + 1], all_dims[i], f, f, weight_norm=False),
                          ConvNeXtBlock(all_dims[i]))
            for i, f in reversed(list(enumerate(factors)))))
        self.pre_module = pre_module
        self.post_module = post_module

    def encode(self, latent: torch.Tensor) -> torch.Tensor:  # [B, C, 4T] -> [B, 1 + N, T]
        z = self.pre_module(self.downsample(latent))
        semantic, semantic_z = self.semantic_quantizer.encode(z)
        residual, _ = self.quantizer.encode(z - semantic_z)
        return torch.cat((semantic, residual), 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, 1 + N, T] -> [B, C, 4T]
        out: torch.Tensor = self.upsample(self.transformed(codes))
        return out

    def transformed(self, codes: torch.Tensor, memory: Memory | None = None) -> torch.Tensor:
        """[B, 1 + N, T] -> [B, C, T]: the codes' embeddings through the post transformer, the part
        of decoding that reaches far back (after `memory`'s frames, if given: codec_stream.py);
        codec.py `decode_tail` runs the upsampling and what follows on a tail of it."""
        semantic = codes[:, :1].clamp(0, self.semantic_quantizer.codebook_size - 1)
        residual = codes[:, 1:].clamp(0, self.quantizer.codebook_size - 1)
        z = self.semantic_quantizer.decode(semantic) + self.quantizer.decode(residual)
        out: torch.Tensor = self.post_module(z, memory)
        return out

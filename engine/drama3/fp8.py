"""The released block-FP8 format of Drama 3's routed experts (quantization_config bsgemm-moe).

A weight [..., N, K] is stored as float8_e4m3fn with one float32 `weight_scale_inv` per
128x128 block ([..., N/128, K/128]): the real weight is `fp8 * scale_inv` of its block.
One place for the format: the loader's CPU path and the kernel's reference dequantise
with it, the tiny writer and the random full-size weights quantise with it.
"""

from __future__ import annotations

import torch

from engine.drama3.config import FP8_BLOCK

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """[..., N, K] -> [..., N/128, 128, K/128, 128]."""
    rows, cols = weight.shape[-2:]
    return weight.reshape(*weight.shape[:-2], rows // FP8_BLOCK[0], FP8_BLOCK[0], cols // FP8_BLOCK[1], FP8_BLOCK[1])


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [..., N, K] -> float8 [..., N, K] and float32 scale_inv [..., N/128, K/128], scale = amax / 448."""
    blocks = _blocks(weight.float())
    scale = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX  # [..., N/128, K/128]
    quantized = (blocks / scale[..., :, None, :, None]).to(FP8)
    return quantized.flatten(-4, -3).flatten(-2, -1), scale


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Block FP8 [..., N, K] with float32 scales [..., N/128, K/128] -> dtype [..., N, K]."""
    blocks = _blocks(weight.float()) * scale_inv[..., :, None, :, None].float()
    return blocks.flatten(-4, -3).flatten(-2, -1).to(dtype)

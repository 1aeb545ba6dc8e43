"""The tiny checkpoint's codec: codec.pth (release layout) + codec_config.json, from a seed.

Design choices:
- Same structure as the release where streaming cares: the same rates (2,048 samples a
  frame), the same codebooks (4,096 semantic + 9 x 1,024 residual, 8-dim), the same
  causal window-limited transformers (8 layers, 128-frame window) before and after
  quantisation, the encoder transformer in its last block. Only widths shrink.
- The random weights are scaled so the signal neither dies nor saturates, and the
  transformers' layer scales are large enough that far context matters: a streamed
  window needs real left context, as with the released codec (see test_stream.py).
- Weight-normed layers are written as (g, v) under the release's key names, so loading
  folds them exactly as it folds the real codec.pth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from engine.drama3.codec import Codec, CodecConfig, weight_norm_layout
from engine.drama3.codec_layers import CausalConv

_TRANSFORMER = {
    "causal": True, "window_size": 128, "input_dim": 64,
    "config": {"block_size": 2048, "n_layer": 8, "n_head": 4, "dim": 64, "intermediate_size": 192,
               "n_local_heads": -1, "head_dim": 16, "rope_base": 10000, "norm_eps": 1e-5},
}
TINY_CODEC = {
    "sample_rate": 44100,
    "encoder_dim": 4,
    "encoder_rates": [2, 4, 8, 8],
    "latent_dim": 64,
    "decoder_dim": 32,
    "decoder_rates": [8, 8, 4, 2],
    "encoder_transformer_layers": [0, 0, 0, 2],
    "decoder_transformer_layers": [0, 0, 0, 0],
    "transformer_general_config": {"block_size": 8192, "n_local_heads": -1, "head_dim": 64,
                                   "rope_base": 10000, "norm_eps": 1e-5, "channels_first": True},
    "quantizer": {
        "input_dim": 64, "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
        "quantizer_dropout": 0.5, "downsample_factor": [2, 2], "semantic_codebook_size": 4096,
        "pre_module": _TRANSFORMER, "post_module": _TRANSFORMER,
    },
}
LAYER_SCALE = 0.7  # the release initialises 0.01; here far context must matter (32 frames: ~11 dB)
RESIDUAL_GAIN = 0.3  # residual branches: the signal grows ~1.3x, not ~3x, per decoder block
OUTPUT_GAIN = 0.09  # row norm of the last conv: speech-like level after tanh


@torch.no_grad()
def random_codec(config: CodecConfig, seed: int, device: str | torch.device = "cpu") -> Codec:
    """A codec of `config` with deterministic random weights, float32, made on `device`
    (the full-size benchmark codec is generated on the GPU)."""
    generator = torch.Generator(device).manual_seed(seed)
    with torch.device(device):
        codec = Codec(config)
    last_conv = f"decoder.model.{len(codec.decoder.model) - 2}.conv.weight"
    for name, p in codec.named_parameters():
        if name.endswith("alpha"):  # Snake frequencies around 1
            p.copy_(1.0 + 0.3 * torch.rand(p.shape, generator=generator, device=p.device))
        elif name.endswith("gamma"):  # layer scales
            p.fill_(LAYER_SCALE)
        elif name.endswith("codebook.weight"):
            p.normal_(generator=generator)
        elif name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:  # a matrix or a kernel [out, in, k]: about unit-norm rows keep the signal's scale
            p.normal_(generator=generator).mul_(1.0 / math.sqrt(p[0].numel()))
    for module in codec.modules():
        if isinstance(module, torch.nn.ConvTranspose1d):  # weight [in, out, k]: fan-in is in * k / stride
            fan_in = module.weight.shape[0] * module.weight.shape[2] / module.stride[0]
            module.weight.normal_(generator=generator).mul_(1.0 / math.sqrt(fan_in))
    for name, module in codec.named_modules():
        if name.endswith("block.3") and isinstance(module, CausalConv):  # a residual unit's branch
            module.conv.weight.mul_(RESIDUAL_GAIN)
    codec.get_parameter(last_conv).mul_(OUTPUT_GAIN)
    return codec.eval()


def release_state_dict(codec: Codec) -> dict[str, torch.Tensor]:
    """codec's weights under the release's keys: weight-normed layers as (g, v)."""
    layout = weight_norm_layout(codec)
    state = {}
    for key, value in codec.state_dict().items():
        if key in layout:
            g_key, v_key = layout[key]
            norm = value.flatten(1).norm(dim=1).view(-1, *([1] * (value.ndim - 1)))  # [out, 1, 1]
            state[g_key], state[v_key] = norm.clone(), value.clone()
        else:
            state[key] = value.clone()
    return state


def write_tiny_codec(directory: Path, seed: int = 0) -> list[Path]:
    """Write codec.pth and codec_config.json of a tiny random codec into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    codec = random_codec(CodecConfig.from_dict(TINY_CODEC), seed)
    weights, config = directory / "codec.pth", directory / "codec_config.json"
    torch.save(release_state_dict(codec), weights)
    config.write_text(json.dumps(TINY_CODEC, indent=2) + "\n", encoding="utf-8")
    return [weights, config]

"""A Drama 3 model of any config with random weights made on its own device, and the
parts an engine serves it with.

    model = random_model(config, device, dtype)
    model, config, tokenizer, codec = random_parts("full", device)   # `retake serve --random-weights`

No real checkpoint exists on any machine we have, so GPU benchmarks build the full-size
model (the `full` preset) with random weights drawn straight on the GPU, in the dtypes
the release ships: block-FP8 experts with float32 scales per 128x128 block, everything
else bfloat16 (DeltaNet decays float32). Drawing 35B parameters on the CPU and copying
them would take minutes; on the GPU it takes seconds.

The scales follow tiny.py's (`initial_value`): linear weights N(0, 1/fan_in), embeddings
N(0, 1), zero-centred norms N(0, 0.01), decays exp(A_log) in [0.01, 1], so activations
stay O(1) through 40 layers. Routing on random weights is near-uniform: say so whenever
quoting numbers measured with them.

`random_parts` adds what serving needs: the preset's config, a byte-level tokenizer laid
out at its token ids (tokenizer.py `tokenizer_for`) and a random codec of the release's
size (the tiny preset: the tiny codec), ready as `load_codec` makes it (float16 decoder on
a GPU). The engine serving them flags demo weights, as for the tiny demo checkpoint.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from engine.drama3.checkpoint import checkpoint_key, empty_model
from engine.drama3.codec import Codec, CodecConfig, ready
from engine.drama3.codec_tiny import TINY_CODEC, random_codec
from engine.drama3.config import Drama3Config, preset
from engine.drama3.fp8 import quantize_fp8
from engine.drama3.model import Drama3Model
from engine.drama3.tiny import EMBEDDING, ZERO_CENTRED_NORM, tiny_config
from engine.drama3.tokenizer import tokenizer_for

PRESETS = ("full", "tiny")


def _fill(name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
    key = checkpoint_key(name) if name != "candidate_head" else "lm_head.weight"
    shape, device = tensor.shape, tensor.device
    if key.endswith("A_log"):
        tensor.copy_(torch.rand(shape, generator=generator, device=device).mul(0.99).add(0.01).log())
        return
    normal = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
    if key.endswith("dt_bias"):
        normal.mul_(0.5)
    elif key.endswith("linear_attn.norm.weight"):
        normal.mul_(0.1).add_(1.0)
    elif ZERO_CENTRED_NORM.search(key):
        normal.mul_(0.1)
    elif not EMBEDDING.search(key):
        normal.mul_(shape[-1] ** -0.5)  # a linear weight [out, in] or a conv [C, 1, K]
    tensor.copy_(normal)


@torch.inference_mode()
def random_model(config: Drama3Config, device: torch.device | str, dtype: torch.dtype,
                 seed: int = 0) -> Drama3Model:
    """The model for `config` on `device` with random weights, experts block-FP8 if the config says so."""
    model = empty_model(config, device, dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = model.state_dict(keep_vars=True)
    for name, tensor in tensors.items():
        stem, _, leaf = name.rpartition(".")
        if stem.endswith(".experts") and leaf in ("w13", "w2") and tensor.dtype == torch.float8_e4m3fn:
            for expert in range(tensor.shape[0]):  # one expert at a time: no 1 GB float temporaries
                value = torch.randn(tensor.shape[1:], generator=generator, device=tensor.device)
                value *= tensor.shape[-1] ** -0.5
                quantized, scale = quantize_fp8(value)
                tensor.data[expert].copy_(quantized)
                tensors[f"{name}_scale_inv"].data[expert].copy_(scale)
        elif leaf.endswith("_scale_inv") or tensor.dtype == torch.long:
            continue  # scales come with their weights; candidate_ids are set by init_buffers
        else:
            _fill(name, tensor.data, generator)
    return model


def random_parts(name: str, device: torch.device, dtype: torch.dtype | None = None,
                 seed: int = 0) -> tuple[Drama3Model, Drama3Config, Tokenizer, Codec]:
    """The model (eval), config, tokenizer and codec of preset `name` with random weights on
    `device`; dtype defaults to bfloat16 on CUDA, float32 elsewhere."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    config = Drama3Config.from_dict(preset("full") if name == "full" else tiny_config())
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    model = random_model(config, device, dtype, seed).eval()
    tokenizer = tokenizer_for(config.semantic_start_token_id, config.eos_token_id, config.text.vocab_size)
    codec_config = CodecConfig.from_dict() if name == "full" else CodecConfig.from_dict(TINY_CODEC)
    codec = ready(random_codec(codec_config, seed, device), device)
    return model, config, tokenizer, codec

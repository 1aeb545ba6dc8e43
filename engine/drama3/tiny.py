"""The tiny random-weight Drama 3 checkpoint, written in exactly the released layout.

    write_tiny_checkpoint(directory, seed=0) -> [Path, ...]

writes config.json (the `tiny` preset of config.py, flagged `demo_weights`), model.safetensors.index.json with
two shards (the backbone; lm_head and the tower) under the original key names,
block-FP8 experts (float8_e4m3fn with float32 `weight_scale_inv` per 128x128 block),
tokenizer.json (tokenizer.py's byte-level tokenizer with every special token) and the
tiny codec (codec_tiny.py). Its audio is noise. `demo_checkpoint()` is this checkpoint
(seed 0) in Retake's cache, written on first use: what runs when no checkpoint is given.

Design choices:
- The key list comes from the loader's own table (`checkpoint_layout` of a model built on
  the meta device), so the writer and the loader cannot disagree on a name; tests check
  names against the references separately.
- Scaled normal init so activations stay O(1): linear weights N(0, 1/fan_in), embeddings
  N(0, 1), zero-centred norm weights N(0, 0.1^2) (a scale of 1 + w, not exactly 1, so the
  "1 +" is exercised), decays exp(A_log) in [0.01, 1]. Other floats are stored bfloat16
  as released; A_log and dt_bias float32.
- Deterministic: one CPU generator seeded once, tensors drawn in a fixed key order, files
  written with sorted JSON. The same seed writes byte-identical files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

import engine.checkpoints as checkpoints
from engine.drama3.checkpoint import INDEX_FILE, LM_HEAD, checkpoint_layout, default_dtype
from engine.drama3.codec_tiny import write_tiny_codec
from engine.drama3.config import Drama3Config, preset
from engine.drama3.fp8 import quantize_fp8
from engine.drama3.model import Drama3Model
from engine.drama3.tokenizer import tiny_tokenizer, token_ids

ZERO_CENTRED_NORM = re.compile(r"(norm|layernorm)\.weight$")
EMBEDDING = re.compile(r"(embed_tokens|codebook_embeddings|semantic_embedding|codebook_embedding)\.weight$")
FLOAT32_KEYS = re.compile(r"(A_log|dt_bias)$")
DEMO_NAME = "drama3-tiny"  # the demo checkpoint's directory in Retake's cache


def tiny_config() -> dict[str, Any]:
    return preset("tiny", **token_ids(tiny_tokenizer()))


def initial_value(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """A random float32 tensor for checkpoint `key` (see the module docstring for the scales)."""
    normal = torch.randn(shape, generator=generator)
    if key.endswith("A_log"):
        return torch.rand(shape, generator=generator).mul(0.99).add(0.01).log()  # exp(A_log) in [0.01, 1]
    if key.endswith("dt_bias"):
        return 0.5 * normal
    if key.endswith("linear_attn.norm.weight"):  # the gated norm's plain weight
        return 1.0 + 0.1 * normal
    if ZERO_CENTRED_NORM.search(key):
        return 0.1 * normal
    if EMBEDDING.search(key):
        return normal
    return normal.mul(shape[-1] ** -0.5)  # a linear weight [out, in] or a conv1d's [C, 1, K]


def checkpoint_tensors(config: Drama3Config, seed: int) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor of a random model for `config`, by original key name."""
    with torch.device("meta"), default_dtype(torch.float32):
        layout = checkpoint_layout(Drama3Model(config))
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for key, target in layout.items():
        if key.endswith("weight_scale_inv"):
            continue  # drawn with its weight
        value = initial_value(key, target.shape, generator)
        if target.dtype == torch.float8_e4m3fn:
            tensors[key], tensors[key + "_scale_inv"] = quantize_fp8(value)
        elif FLOAT32_KEYS.search(key):
            tensors[key] = value
        else:
            tensors[key] = value.to(torch.bfloat16)
    assert tensors.keys() == layout.keys(), "every layout key is drawn exactly once"
    return tensors


def write_tiny_checkpoint(directory: Path | str, seed: int = 0) -> list[Path]:
    """Write the tiny checkpoint into `directory` (created if missing); return the files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = tiny_config()
    tensors = checkpoint_tensors(Drama3Config.from_dict(raw), seed)
    shards = {
        "model-00001-of-00002.safetensors": {k: v for k, v in tensors.items() if k.startswith("model.language_model.")},
        "model-00002-of-00002.safetensors": {k: v for k, v in tensors.items()
                                             if not k.startswith("model.language_model.")},
    }
    assert LM_HEAD in shards["model-00002-of-00002.safetensors"]
    written = [directory / "config.json"]
    flagged = {**raw, checkpoints.DEMO_FLAG: True}  # random weights: the UI and logs say its audio is noise
    written[0].write_text(json.dumps(flagged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name, part in shards.items():
        save_file(part, directory / name, metadata={"format": "pt"})
        (directory / name).chmod(0o644)  # safetensors writes 0600; the other files are plain 0644
        written.append(directory / name)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {key: name for name, part in shards.items() for key in sorted(part)}}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    written.append(directory / INDEX_FILE)
    tiny_tokenizer().save(str(directory / "tokenizer.json"))
    written.append(directory / "tokenizer.json")
    written += write_tiny_codec(directory, seed)
    return written


def demo_checkpoint() -> Path:
    """The tiny checkpoint (seed 0) in Retake's cache, written on first use."""
    return checkpoints.demo_checkpoint(DEMO_NAME, write_tiny_checkpoint)

"""Loading a Drama 3 checkpoint: config.json, sharded safetensors, tokenizer.json.

    model, config, tokenizer = load_model("fishaudio/drama-3", device="cuda", dtype=torch.bfloat16)

Design choices:
- Loading is a table. `RENAMES` maps module names to the checkpoint's original key names
  (one explicit list); `SPLITS` says how a stacked module tensor is cut into checkpoint
  tensors (per-expert FP8 weights and scales, the candidate rows of `lm_head.weight`).
  `checkpoint_layout(model)` turns both into {checkpoint key: where it goes}, which the
  loader checks every shard against and the tiny writer writes from.
- The model is built on the meta device, materialised empty on the target device, and
  filled one tensor at a time straight from the safetensors shards (never a whole
  state dict in memory): FP8 experts stay FP8, other floats are cast to the model dtype,
  and of `lm_head.weight` only the 4,097 candidate rows are read.
- Any disagreement is refused by name: an unexpected key, a missing key, a wrong shape or
  dtype, a bad config value. Errors are `CheckpointError` (engine/errors.py): the CLI
  prints them as one line.
- A directory or a Hugging Face repo id is found by engine/checkpoints.py (the cache
  first, a download of `HUB_PATTERNS` only when allowed); the tiny demo is tiny.py's.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from engine.checkpoints import resolve_checkpoint
from engine.drama3.config import Drama3Config
from engine.drama3.model import Drama3Model
from engine.drama3.tokenizer import load_tokenizer, semantic_token
from engine.errors import CheckpointError, ConfigError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HUB_PATTERNS = ["*.json", "*.safetensors", "codec.pth", "codec_config.json"]
PROGRESS_MIN_BYTES = 1 << 30  # show loading progress for checkpoints above 1 GiB

# Module name prefix -> checkpoint key prefix; the first match wins.
RENAMES: tuple[tuple[str, str], ...] = (
    (r"backbone\.", "model.language_model."),
    (r"tower\.codebook_embeddings\.", "audio_decoder.codebook_embeddings."),
    (r"tower\.shared_layers\.(\d+)\.embedding\.", r"audio_decoder_mtp_shared.layers.\1.semantic_embedding."),
    (r"tower\.shared_layers\.", "audio_decoder_mtp_shared.layers."),
    (r"tower\.residual_layers\.(\d+)\.embedding\.", r"audio_decoder_mtp.layers.\1.codebook_embedding."),
    (r"tower\.residual_layers\.", "audio_decoder_mtp.layers."),
    (r"tower\.heads\.", "audio_decoder_mtp.heads."),
)
# Stacked expert tensors (`...mlp.experts.w13` [E, 2I, D], `w2` [E, D, I], and their
# `_scale_inv`) cut into per-expert checkpoint tensors `...mlp.experts.{e}.{projection}.weight`
# (or `.weight_scale_inv`): half 0/1 is the gate/up half of the fused w13 rows, None all rows.
SPLITS = {
    "w13": (("gate_proj", 0), ("up_proj", 1)),
    "w2": (("down_proj", None),),
}
LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: module tensor `name`, sub-tensor `index`."""

    name: str
    index: tuple[()] | tuple[int, slice]  # () = the whole tensor; else (expert, row slice)
    shape: tuple[int, ...]  # the checkpoint tensor's shape
    dtype: torch.dtype | None  # required checkpoint dtype (FP8 experts), else None: any float, cast


def checkpoint_key(name: str) -> str:
    for pattern, replacement in RENAMES:
        key, count = re.subn("^" + pattern, replacement, name)
        if count:
            return key
    raise KeyError(f"no checkpoint name for module tensor {name}")


def checkpoint_layout(model: Drama3Model) -> dict[str, Target]:
    """{checkpoint key: Target} for every tensor the model loads (parameters and persistent buffers)."""
    layout: dict[str, Target] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        shape = tuple(tensor.shape)
        if name == "candidate_head":
            vocab = model.config.text.vocab_size
            layout[LM_HEAD] = Target(name, (), (vocab, shape[1]), None)
            continue
        stem, _, leaf = name.rpartition(".")
        stack = leaf.removesuffix("_scale_inv")
        if not (stem.endswith(".experts") and stack in SPLITS):
            layout[checkpoint_key(name)] = Target(name, (), shape, None)
            continue
        scale = leaf.endswith("_scale_inv")
        suffix = "weight_scale_inv" if scale else "weight"
        fp8 = tensor.dtype if tensor.dtype == torch.float8_e4m3fn else None
        for expert in range(shape[0]):
            for projection, half in SPLITS[stack]:
                rows = shape[1] if half is None else shape[1] // 2
                start = 0 if half is None else half * rows
                key = f"{checkpoint_key(stem)}.{expert}.{projection}.{suffix}"
                layout[key] = Target(name, (expert, slice(start, start + rows)), (rows, shape[2]),
                                     torch.float32 if scale else fp8)
    return layout


# ─── Reading ──────────────────────────────────────────────────────────────────


def read_config(path: Path) -> Drama3Config:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path} has no config.json; is it a Drama 3 checkpoint directory?")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file} is not valid JSON: {error}") from error
    try:
        return Drama3Config.from_dict(raw)
    except ConfigError as error:
        raise CheckpointError(f"{file}: {error}") from error


def shard_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its index names, or model.safetensors."""
    index = path / INDEX_FILE
    if not index.is_file():
        if (path / SINGLE_FILE).is_file():
            return [path / SINGLE_FILE]
        raise CheckpointError(f"{path} has neither {INDEX_FILE} nor {SINGLE_FILE}")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{index} has no readable weight_map: {error}") from error
    files = [path / name for name in sorted(set(weight_map.values()))]
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{index} names {file.name}, which is missing")
    return files


def load_tensors(model: Drama3Model, shards: list[Path],
                 progress: Callable[[int, int, int, int], None] | None = None) -> None:
    """Fill every checkpoint tensor of `model` from `shards`; refuse any mismatch by name.

    progress(shard, shards, bytes done, bytes total) is called after each shard."""
    layout = checkpoint_layout(model)
    tensors = model.state_dict(keep_vars=True)
    seen: dict[str, Path] = {}
    total, done = sum(f.stat().st_size for f in shards), 0
    for number, file in enumerate(shards, 1):
        with safe_open(file, framework="pt") as reader:
            for key in reader.keys():
                target = layout.get(key)
                if target is None:
                    raise CheckpointError(f"{file.name}: unexpected tensor {key} (not part of the Drama 3 model)")
                if key in seen:
                    raise CheckpointError(f"tensor {key} appears twice ({seen[key].name} and {file.name})")
                seen[key] = file
                part = reader.get_slice(key)
                shape = tuple(part.get_shape())
                if shape != target.shape:
                    raise CheckpointError(f"{file.name}: tensor {key} has shape {list(shape)}; "
                                          f"the config needs {list(target.shape)}")
                value = _candidate_rows(part, model.config) if key == LM_HEAD else part[:]
                _check_dtype(key, value, target, file)
                destination = tensors[target.name].data
                if target.index:
                    destination = destination[target.index]
                destination.copy_(value)
        done += file.stat().st_size
        if progress is not None:
            progress(number, len(shards), done, total)
    missing = [key for key in layout if key not in seen]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"the checkpoint lacks tensor {', '.join(missing[:5])}{more}")


def _candidate_rows(part: Any, config: Drama3Config) -> torch.Tensor:  # part: a safetensors slice (untyped)
    """The lm_head rows of `candidate_ids` (EOS and the band, sorted), read without the rest."""
    eos, start, end = config.eos_token_id, config.semantic_start_token_id, config.semantic_end_token_id
    band, eos_row = part[start:end + 1], part[eos:eos + 1]
    return torch.cat((eos_row, band)) if eos < start else torch.cat((band, eos_row))


def _check_dtype(key: str, value: torch.Tensor, target: Target, file: Path) -> None:
    if target.dtype is not None and value.dtype != target.dtype:
        raise CheckpointError(f"{file.name}: tensor {key} is {value.dtype}; block-FP8 experts need {target.dtype}")
    if target.dtype is None and not value.is_floating_point():
        raise CheckpointError(f"{file.name}: tensor {key} is {value.dtype}; expected floating point")


# ─── Building, resolving ──────────────────────────────────────────────────────


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def empty_model(config: Drama3Config, device: torch.device | str, dtype: torch.dtype) -> Drama3Model:
    """The model with uninitialised weights on `device` (built on the meta device, no CPU copy)."""
    with torch.device("meta"), default_dtype(dtype):
        model = Drama3Model(config)
    model.to_empty(device=device)
    model.init_buffers()
    return model.eval().requires_grad_(False)


def print_progress(name: str) -> Callable[[int, int, int, int], None]:
    started = time.perf_counter()

    def show(shard: int, shards: int, done: int, total: int) -> None:
        elapsed = time.perf_counter() - started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        print(f"[drama3] loading {name}: shard {shard}/{shards}, {done / 2**30:.1f}/{total / 2**30:.1f} GiB, "
              f"{rate / 2**20:.0f} MiB/s, {eta:.0f} s left", file=sys.stderr, flush=True)

    return show


def load_model(source: Path | str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               progress: Callable[[int, int, int, int], None] | None = None,
               ) -> tuple[Drama3Model, Drama3Config, Tokenizer]:
    """(model, config, tokenizer) of a checkpoint directory or Hugging Face repo id."""
    path = resolve_checkpoint(source, HUB_PATTERNS)
    config = read_config(path)
    tokenizer = load_checked_tokenizer(path, config)
    shards = shard_files(path)
    if progress is None and sum(f.stat().st_size for f in shards) >= PROGRESS_MIN_BYTES:
        progress = print_progress(path.name)
    model = empty_model(config, device, dtype)
    load_tensors(model, shards, progress)
    return model, config, tokenizer


def load_checked_tokenizer(path: Path, config: Drama3Config) -> Tokenizer:
    try:
        tokenizer = load_tokenizer(path / "tokenizer.json")
    except FileNotFoundError as error:
        raise CheckpointError(str(error)) from error
    except Exception as error:  # tokenizers raises its own exception type on a corrupt file
        raise CheckpointError(f"{path / 'tokenizer.json'} is not a tokenizer file: {error}") from error
    expected = {"<|im_end|>": config.eos_token_id, semantic_token(0): config.semantic_start_token_id,
                semantic_token(config.codebook_size - 1): config.semantic_end_token_id}
    for token, token_id in expected.items():
        if tokenizer.token_to_id(token) != token_id:
            raise CheckpointError(f"tokenizer.json gives {token} id {tokenizer.token_to_id(token)}; "
                                  f"config.json says {token_id}")
    return tokenizer

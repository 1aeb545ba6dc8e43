"""The model a Drama 3 bench times, the prompts it feeds it, and the rows it reports.

Design choices:
- Random weights are drawn on the GPU (random_weights.py) in the released dtypes; the
  routing of random weights is near-uniform, which every report says.
- Prompts are synthetic frame rows (text rows, then audio rows): tokenising is not part of
  what is measured; `prompt_ms` is measured by `retake say` instead.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from engine.drama3.codec import Codec
    from engine.drama3.config import Drama3Config
    from engine.drama3.model import Drama3Model
    from engine.drama3.prompt import Prompt

Row = dict[str, Any]  # one printed and JSON row of a benchmark


def build(args: argparse.Namespace) -> tuple[Drama3Model, Codec, Drama3Config, str]:
    """(model, codec, config, source) on the device; the fast path is installed later."""
    from engine.drama3.codec import load_codec

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.checkpoint is not None:
        from engine.drama3.checkpoint import load_model

        model, config, _ = load_model(args.checkpoint, device=device, dtype=dtype)
        codec = load_codec(args.checkpoint, device=device)
        source = str(args.checkpoint)
    else:
        from engine.drama3.random_weights import random_parts

        model, config, _, codec = random_parts(args.preset, device, dtype)  # the codec as served: ready()
        source = f"random weights, preset {args.preset}"
    return model, codec, config, source


def synthetic_prompt(config: Drama3Config, rows: int, max_new_tokens: int, seed: int = 0) -> Prompt:
    """A prompt of `rows` frame rows: a third text, then audio rows with random codes."""
    from engine.drama3.prompt import Prompt
    from engine.drama3.sampling import Sampling

    generator = torch.Generator().manual_seed(seed)
    frames = torch.zeros(rows, config.frame_width, dtype=torch.long)
    text = max(2, rows // 3)
    frames[:text, 0] = torch.randint(0, 256, (text,), generator=generator)
    codes = torch.randint(0, 1024, (rows - text, config.num_codebooks), generator=generator)
    codes[:, 0] = torch.randint(1, config.codebook_size, (rows - text,), generator=generator)
    frames[text:, 1:] = codes
    frames[text:, 0] = codes[:, 0] + config.semantic_start_token_id
    sampling = Sampling(temperature=1.0, top_p=0.9, top_k=30, max_new_tokens=max_new_tokens, seed=seed)
    return Prompt(rows=frames, history_used=0, sampling=sampling)

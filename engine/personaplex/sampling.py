"""Sampling settings and the token sampler, as the PersonaPlex reference does it.

Design choices:
- Defaults are the reference's `LMGen` values: text temperature 0.7 / top-k 25, audio
  temperature 0.8 / top-k 250 (PP-lm, PP-offline). `greedy` (or a temperature of 0) takes
  the argmax, which is what the vllm-omni native engine runs.
- A draw is `argmax(p / Exponential(1))` over the top-k probabilities: a draw from p with
  no host sync (moshi `utils/sampling.py`). The noise comes from the engine's own
  `torch.Generator`, so a seeded conversation is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.errors import RequestError


@dataclass(frozen=True)
class Sampling:
    text_temperature: float = 0.7
    text_top_k: int = 25
    audio_temperature: float = 0.8
    audio_top_k: int = 250
    greedy: bool = False
    seed: int | None = None

    def checked(self) -> Sampling:
        for name in ("text_temperature", "audio_temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise RequestError(f"{name} must be a non-negative number (0 is greedy); got {value!r}")
        for name in ("text_top_k", "audio_top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RequestError(f"{name} must be an integer >= 1; got {value!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise RequestError(f"seed must be an integer or omitted; got {self.seed!r}")
        return self


def sample_token(logits: torch.Tensor, temperature: float, top_k: int,
                 generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] (fp32) -> tokens [B]; temperature 0 (or no generator) is greedy."""
    if temperature <= 0 or generator is None:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    probs, ids = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return ids.gather(-1, (probs / noise).argmax(dim=-1, keepdim=True))[:, 0]

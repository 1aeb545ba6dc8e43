"""Sampling settings and the token draws of every slot, as data on the device.

    rows = SamplingRows(slots, device)
    rows.set(slot, Sampling(seed=7))                 # between ticks: the slot's settings and seed
    text = rows.draw(logits, counter, STREAM_TEXT)   # logits [B, V] -> tokens [B], in a CUDA graph

Design choices:
- Defaults are the reference's `LMGen` values: text temperature 0.7 / top-k 25, audio
  temperature 0.8 / top-k 250 (PP-lm, PP-offline). A temperature of 0 (or `greedy`) takes
  the argmax, which is what the vllm-omni native engine runs.
- Settings are per slot and live in device tensors [B] (`SamplingRows`): a captured tick
  reads them, so changing a conversation's settings never drops a CUDA graph, and two
  conversations may sample differently in one batch.
- A draw is Gumbel-max over the top-k candidates: argmax(logits / T + G) over the
  logits >= the row's k-th largest (ties at the threshold are kept). The noise G is
  counter-based (engine/kernels/draws.py: Philox keyed by the slot's seed, its tick
  counter, the stream and the candidate's id), so a seeded conversation draws the same
  tokens in any slot of any batch, in a graph or eagerly: no generator state at all.
  Streams: 0 the text token, 1 + t the depformer's step t.
- `draw_reference` below is the definition; on CUDA the fused kernel
  (engine/kernels/token_draw.py) computes the same from one sort, without the hundreds of
  small integer ops the Philox reference takes in torch (if it fails to build on the GPU,
  the reference runs, logged once: engine/kernels/fallback.py). On a CPU, where each torch op
  costs microseconds of dispatch, the same Philox words are computed in numpy
  (`gumbel_numpy`: draws.philox_numpy's words, the noise within an ulp of the reference's
  log): the CPU demo keeps its tick.
- A seed that is not given is drawn from the OS at `set` time, so unseeded
  conversations differ.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.errors import RequestError
from engine.kernels import draws
from engine.kernels.draws import gumbel_reference

log = logging.getLogger("retake.personaplex")
STREAM_TEXT = 0  # the text token; depformer step t draws from stream 1 + t
MAX_SEED = 2**63 - 1


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
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise RequestError(f"seed must be an integer in 0..{MAX_SEED} or omitted; got {self.seed!r}")
        return self


def draw_reference(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, seed: torch.Tensor,
                   counter: torch.Tensor, stream: int) -> torch.Tensor:
    """Tokens [B] (int64) from logits [B, V] (float32); the other tensors are [B]."""
    V = logits.shape[-1]
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, (top_k.clamp(1, V) - 1)[:, None])  # [B, 1]
    t = torch.where(temperature > 0, temperature, 1.0).double()[:, None]
    noise = gumbel_reference(seed, counter, stream, torch.arange(V, device=logits.device).expand_as(logits))
    score = torch.where(logits >= kth, logits.double() / t + noise, -torch.inf)  # [B, V]
    return torch.where(temperature > 0, score.argmax(-1), logits.argmax(-1))


def gumbel_numpy(seed: torch.Tensor, counter: torch.Tensor, stream: int, columns: int) -> torch.Tensor:
    """`gumbel_reference(seed, counter, stream, arange(columns))` [B, columns] float64, on a CPU: the
    same Philox words (`draws.philox_numpy`), the logs taken in numpy (within an ulp of torch's)."""
    counter = counter.long()[:, None]  # [B, 1]
    words = draws.philox_numpy(seed.long()[:, None], torch.arange(columns)[None], counter & draws.MASK32,
                               torch.tensor(stream), counter >> 32)  # [B, columns]
    uniform = (words.numpy().astype(np.float64) + 0.5) * draws.UNIFORM_SCALE
    return torch.from_numpy(-np.log(-np.log(uniform)))


def _draw_cpu(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, seed: torch.Tensor,
              counter: torch.Tensor, stream: int) -> torch.Tensor:
    """`draw_reference` with the noise from `gumbel_numpy`."""
    V = logits.shape[-1]
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, (top_k.clamp(1, V) - 1)[:, None])  # [B, 1]
    t = torch.where(temperature > 0, temperature, 1.0).double()[:, None]
    score = torch.where(logits >= kth, logits.double() / t + gumbel_numpy(seed, counter, stream, V), -torch.inf)
    return torch.where(temperature > 0, score.argmax(-1), logits.argmax(-1))


@functools.cache
def _kernel() -> Callable[..., torch.Tensor] | None:
    """The fused draw (falling back to `draw_reference` if it fails on this GPU), or None (no Triton)."""
    try:
        from engine.kernels.fallback import guarded
        from engine.kernels.token_draw import draw_kernel
    except ImportError as error:
        log.warning("fused token draw unavailable (%s): using the torch path", error)
        return None
    return functools.partial(guarded, "token draw", draw_kernel, draw_reference)


def draw(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, seed: torch.Tensor,
         counter: torch.Tensor, stream: int, fused: bool) -> torch.Tensor:
    """`draw_reference`, by the fused kernel on CUDA when `fused`."""
    if not logits.is_cuda:
        if not bool((temperature > 0).any()):  # all greedy: no noise to draw
            return logits.argmax(-1)
        return _draw_cpu(logits, temperature, top_k, seed, counter, stream)
    kernel = _kernel() if fused and logits.is_cuda else None
    run = kernel or draw_reference
    return run(logits, temperature, top_k, seed, counter, stream)


class SamplingRows:
    """Every slot's sampling settings and seed, as device tensors [B] a captured tick reads."""

    def __init__(self, slots: int, device: torch.device) -> None:
        self.text_temperature = torch.zeros(slots, device=device)
        self.text_top_k = torch.ones(slots, dtype=torch.long, device=device)
        self.audio_temperature = torch.zeros(slots, device=device)
        self.audio_top_k = torch.ones(slots, dtype=torch.long, device=device)
        self.seed = torch.zeros(slots, dtype=torch.long, device=device)
        self.fused = device.type == "cuda"

    def set(self, rows: int | slice, sampling: Sampling) -> int:
        """The settings of `rows` (between ticks); returns the seed they draw from."""
        seed = sampling.seed if sampling.seed is not None else secrets.randbelow(MAX_SEED)
        greedy = sampling.greedy
        self.text_temperature[rows] = 0.0 if greedy else float(sampling.text_temperature)
        self.audio_temperature[rows] = 0.0 if greedy else float(sampling.audio_temperature)
        self.text_top_k[rows] = sampling.text_top_k
        self.audio_top_k[rows] = sampling.audio_top_k
        self.seed[rows] = seed
        return seed

    def text(self, logits: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        """logits [B, text_card] (float32), counter [B] (the slots' steps) -> text tokens [B]."""
        B = logits.shape[0]
        return draw(logits, self.text_temperature[:B], self.text_top_k[:B], self.seed[:B], counter, STREAM_TEXT,
                    self.fused)

    def audio(self, logits: torch.Tensor, counter: torch.Tensor, step: int) -> torch.Tensor:
        """logits [B, card] (float32) of depformer step `step` -> codes [B]."""
        B = logits.shape[0]
        return draw(logits, self.audio_temperature[:B], self.audio_top_k[:B], self.seed[:B], counter,
                    STREAM_TEXT + 1 + step, self.fused)

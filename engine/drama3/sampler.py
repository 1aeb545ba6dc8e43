"""The sampler: a frame's tokens drawn with temperature, top-p, top-k, and repetition-aware
resampling, from a take's settings (sampling.py).

Design choices:
- Inside the decoder the settings of every slot are tensors (`SamplingTensors`, a private
  detail of the step), so one captured step serves every take.
- One sampler, `sample_top_k_top_p`, for the main token and the codebook heads, with
  sglang-omni's semantics: fp32 logits / temperature, sorted, cumulative softmax over
  the whole vocabulary, drop what passes top_p, drop rank >= top_k, always keep rank 0.
  The main token's draws keep the token that crosses top_p (so end of speech stays
  reachable); the codebook heads drop it.
- Temperature 0 is greedy (rank 0 of a stable sort: the lowest id among ties). The
  noise is drawn anyway so a take's random stream does not depend on its settings.
- Draws are `argmax(p / Exponential(1))`, equivalent to drawing from p, with no host
  sync; the sampling parameters are tensors. Together with a per-take
  `torch.Generator` the step stays capturable as a CUDA graph.
- Rows of a batch may each have their own generator (one per take in a batched decode
  step): row i's noise is drawn from generator i alone, the same values a batch of that
  one row would draw, so a seeded take samples the same frames alone and batched.
- Repetition-aware sampling (RAS) of the main token: both draws are always made (so
  the random stream does not depend on the window); a semantic first draw that
  repeats a main token of the last 16 frame rows (prompt rows included) takes the
  second draw. Its settings are fixed by the model, not by requests.
- The codebook heads cap top-k at 30 whatever the request says: wider caps cost
  speaker similarity (sglang-omni, mlx-audio).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.drama3.sampling import Sampling

RAS_WINDOW_FRAMES = 16
EMPTY_RAS_SLOT = -1  # pads the window of a prompt shorter than 16 rows; matches no id
RAS_TEMPERATURE = 1.0
RAS_TOP_P = 0.95
RAS_TOP_K = 30
CODEBOOK_TOP_K = 30
MIN_TEMPERATURE = 1e-5


@dataclass
class SamplingTensors:
    """A take's settings as tensors [B], so one captured step serves every take."""

    temperature: torch.Tensor  # float32 [B]
    top_k: torch.Tensor  # int64 [B]
    top_p: torch.Tensor  # float32 [B]

    @classmethod
    def of(cls, sampling: Sampling, device: torch.device | str = "cpu") -> SamplingTensors:
        return cls(torch.tensor([sampling.temperature], dtype=torch.float32, device=device),
                   torch.tensor([sampling.top_k], dtype=torch.long, device=device),
                   torch.tensor([sampling.top_p], dtype=torch.float32, device=device))

    def fill(self, sampling: Sampling, row: int | slice = slice(None)) -> None:
        """Copy new settings into the same tensors (the addresses a graph captured): every
        row, or one row (a batch slot)."""
        self.temperature[row].fill_(sampling.temperature)  # (fill_: no copy from host memory)
        self.top_k[row].fill_(sampling.top_k)
        self.top_p[row].fill_(sampling.top_p)


Generators = torch.Generator | Sequence[torch.Generator] | None  # one for the batch, or one per row


def exponential_noise(like: torch.Tensor, generator: Generators) -> torch.Tensor:
    """Exponential(1) noise shaped like `like` [B, V]: from one generator, or row i from generator i."""
    noise = torch.empty_like(like)
    if generator is None or isinstance(generator, torch.Generator):
        return noise.exponential_(1.0, generator=generator)
    for row, row_generator in zip(noise, generator, strict=True):  # a take's draws come from its own stream
        row.exponential_(1.0, generator=row_generator)
    return noise


def sample_top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, generator: Generators = None, *,
                       keep_crossing: bool = False, max_k: int | None = None) -> torch.Tensor:
    """One id per row of logits [B, V]; temperature, top_p float [B], top_k int [B].

    `max_k`, a static bound on top_k, ranks only that many candidates (a top-k instead of
    a sort of the whole vocabulary); the probabilities are still those of the whole
    vocabulary, so the kept set and its distribution are the same."""
    scaled = logits.float() / temperature.float().clamp(min=MIN_TEMPERATURE)[:, None]  # [B, V]
    if max_k is not None and max_k < scaled.shape[-1]:
        sorted_logits, sorted_ids = scaled.topk(max_k, dim=-1)  # [B, k], descending
        probs_sorted = (sorted_logits - scaled.logsumexp(dim=-1, keepdim=True)).exp()
    else:
        sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True, stable=True)  # [B, V]
        probs_sorted = sorted_logits.softmax(dim=-1)
    cumulative = probs_sorted.cumsum(dim=-1)  # [B, k or V]
    dropped = cumulative > top_p.float()[:, None]
    if keep_crossing:  # a token is dropped only if the one before it already passed top_p
        dropped = torch.cat((torch.zeros_like(dropped[:, :1]), dropped[:, :-1]), dim=-1)
    ranks = torch.arange(sorted_logits.shape[-1], device=logits.device)  # [k or V]
    dropped |= ranks >= top_k[:, None]
    dropped[:, 0] = False
    probs = sorted_logits.masked_fill(dropped, -math.inf).softmax(dim=-1)  # [B, k or V]
    # An exponential draw of exactly 0 would turn p / 0 into inf or nan (argmax's pick).
    noise = exponential_noise(probs, generator).clamp_(min=torch.finfo(probs.dtype).tiny)
    choice = (probs / noise).argmax(dim=-1, keepdim=True)  # [B, 1]
    choice = torch.where(temperature[:, None] == 0, torch.zeros_like(choice), choice)
    return sorted_ids.gather(-1, choice).squeeze(-1)  # [B]


def sample_main(candidate_logits: torch.Tensor, candidate_ids: torch.Tensor, ras_window: torch.Tensor,
                settings: SamplingTensors, semantic_start: int, codebook_size: int,
                generator: Generators = None) -> torch.Tensor:
    """The main token ids [B] (end of speech or a semantic token) with RAS.

    candidate_logits [B, C] are the logits of candidate_ids [C]; ras_window [B, 16]
    holds the main tokens of the last 16 rows, oldest first, padded with -1."""
    first = candidate_ids[sample_top_k_top_p(candidate_logits, settings.temperature, settings.top_k,
                                             settings.top_p, generator, keep_crossing=True)]  # [B]
    fixed = torch.ones_like(settings.temperature)
    retry = candidate_ids[sample_top_k_top_p(candidate_logits, fixed * RAS_TEMPERATURE,
                                             torch.full_like(settings.top_k, RAS_TOP_K), fixed * RAS_TOP_P,
                                             generator, keep_crossing=True, max_k=RAS_TOP_K)]  # [B]
    repeated = (ras_window == first[:, None]).any(dim=-1)
    semantic = (first >= semantic_start) & (first < semantic_start + codebook_size)
    return torch.where(repeated & semantic, retry, first)


def sample_code(logits: torch.Tensor, settings: SamplingTensors, generator: Generators = None) -> torch.Tensor:
    """A codebook head's code [B] from its logits [B, V]: the request's settings, top-k capped."""
    return sample_top_k_top_p(logits, settings.temperature, settings.top_k.clamp(max=CODEBOOK_TOP_K),
                              settings.top_p, generator, max_k=CODEBOOK_TOP_K)


def ras_window_of(rows: torch.Tensor) -> torch.Tensor:
    """The RAS window [1, 16] of a prompt's rows [R, width]: the last 16 main tokens,
    oldest first, left-padded with EMPTY_RAS_SLOT."""
    window = torch.full((1, RAS_WINDOW_FRAMES), EMPTY_RAS_SLOT, dtype=torch.long, device=rows.device)
    tail = rows[-RAS_WINDOW_FRAMES:, 0]
    window[0, RAS_WINDOW_FRAMES - len(tail):] = tail
    return window


def seed_generator(generator: torch.Generator, seed: int | None) -> torch.Generator:
    """Start a take's random stream: from `seed` if given, else from fresh entropy."""
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def take_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A take's own random stream (see seed_generator)."""
    return seed_generator(torch.Generator(device=device), seed)

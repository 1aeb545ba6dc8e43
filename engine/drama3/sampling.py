"""A take's sampling settings: `Sampling`, the one sampling type, its defaults and its check.

Design choices:
- One type for every caller (the studio's socket, the speech API, the CLI): it owns the
  defaults and the one check, `Sampling.from_fields`, whose messages name the field
  (`where` + name, e.g. `sampling.top_p`) and say what it must be. A missing or null
  field takes the default; JSON's integral numbers (3.0) count as integers. The studio's
  wire form is the dataclass's fields (`dataclasses.asdict`).
- No torch here: the backend's protocol module holds these settings without loading the
  model code. The draws (sampler.py) turn them into per-slot tensors inside the decoder.
- Defaults are the seed's: temperature 1.0 (0 is greedy), top_p 0.9, top_k 30, at most
  1,200 new frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from engine.errors import RequestError

MAX_NEW_TOKENS = 1200
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 0.9
DEFAULT_TOP_K = 30  # the seed's default (sglang-omni leaves the main token uncapped)

MAX_TEMPERATURE = 100.0
MAX_TOP_K = 2**31 - 1
MAX_SEED = 2**63 - 1
FIELDS = ("temperature", "top_p", "top_k", "max_new_tokens", "seed")


@dataclass(frozen=True)
class Sampling:
    """A take's sampling settings. Build from request fields with `from_fields` (checked)."""

    temperature: float = DEFAULT_TEMPERATURE  # 0 is greedy
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    max_new_tokens: int = MAX_NEW_TOKENS
    seed: int | None = None  # a take with a seed is reproducible; None: fresh entropy

    @classmethod
    def from_fields(cls, fields: Mapping[str, object], *, where: str = "",
                    max_new_tokens: int = MAX_NEW_TOKENS) -> Sampling:
        """Settings from a request's fields (missing or null: the default), checked: a
        RequestError names the field as `where` + its name and says what it must be.
        `max_new_tokens` is the most a take may have (also the default's cap)."""
        def given(name: str) -> object:
            value = fields.get(name)
            return getattr(cls, name) if value is None else value

        limit = max_new_tokens
        n = fields.get("max_new_tokens")
        seed = fields.get("seed")
        return cls(temperature=_number(given("temperature"), where + "temperature", 0.0, MAX_TEMPERATURE),
                   top_p=_number(given("top_p"), where + "top_p", 0.0, 1.0, low_open=True),
                   top_k=_integer(given("top_k"), where + "top_k", 1, MAX_TOP_K),
                   max_new_tokens=_integer(min(MAX_NEW_TOKENS, limit) if n is None else n, where + "max_new_tokens",
                                           1, limit),
                   seed=None if seed is None else _integer(seed, where + "seed", 0, MAX_SEED))

    def checked(self, max_new_tokens: int = MAX_NEW_TOKENS) -> Sampling:
        """These settings if valid (the check of `from_fields`)."""
        return Sampling.from_fields(asdict(self), max_new_tokens=max_new_tokens)


def _number(value: object, name: str, low: float, high: float, *, low_open: bool = False) -> float:
    """A finite float in [low, high] (or (low, high])."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a finite number")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits (JSON has them)
        number = math.inf
    if not (math.isfinite(number) and low <= number <= high) or (low_open and number == low):
        shown = f"{number:g}" if math.isfinite(number) else str(value)[:24] + ("..." if len(str(value)) > 24 else "")
        raise RequestError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}] (got {shown})")
    return number


def _integer(value: object, name: str, low: int, high: int) -> int:
    """An int in [low, high]; JSON's 3.0 is 3."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer")
    if not low <= value <= high:
        raise RequestError(f"{name} must be between {low} and {high} (got {value})")
    return value

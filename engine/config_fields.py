"""Checked fields of a checkpoint's config.json, shared by the Drama 3 and PersonaPlex configs.

Every refusal is a `ConfigError` (engine/errors.py) that names the field as `where.name`
and says what value would do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.errors import ConfigError


def config_int(raw: Mapping[str, Any], name: str, where: str, minimum: int = 1) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}.{name} must be an integer >= {minimum}; got {value!r}")
    return value


def config_number(raw: Mapping[str, Any], name: str, where: str, upper: float = math.inf,
                  default: float | None = None) -> float:
    """A finite number in (0, upper]."""
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{name} must be a number; got {value!r}")
    if not (math.isfinite(value) and 0.0 < value <= upper):
        span = "a positive finite number" if upper == math.inf else f"finite and in (0, {upper}]"
        raise ConfigError(f"{where}.{name} must be {span}; got {value!r}")
    return float(value)


def config_require(raw: Mapping[str, Any], name: str, where: str, expected: Any, default: Any = None) -> None:
    value = raw.get(name, default)
    if value != expected:
        raise ConfigError(f"{where}.{name} must be {expected!r} (the only value implemented); got {value!r}")

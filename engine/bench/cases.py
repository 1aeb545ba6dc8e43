"""One kernel's case for `retake bench kernels`: what it runs, on how many copies of its cold data.

Its own module so the case lists (kernels.py, dense_cases.py) share it without importing each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

COLD_BYTES = 128 << 20  # data read cold per timed graph, at least (the L2 cache is 50-60 MiB)
MAX_COPIES = 64


@dataclass
class Case:
    """One kernel at one batch: call(i) and reference(i) run it on copy i of its cold data."""

    kernel: str
    rows: int
    per_step: int  # calls in one decode step of the full model
    bytes: int  # the fewest bytes one call must move
    copies: int
    call: Callable[[int], object]
    reference: Callable[[int], object]
    reference_graphs: bool = True  # False: the reference syncs with the host, time it eagerly


def copies_for(cold_bytes: int) -> int:
    """Copies of a case's data so a timed graph reads at least COLD_BYTES (none from the L2 cache)."""
    return max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / max(cold_bytes, 1))))

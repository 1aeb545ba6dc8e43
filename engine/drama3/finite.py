"""Finding where a take went non-finite: the slot state a failed take leaves, and (debugging,
RETAKE_CHECK_FINITE=1) the slot's state after every restore and prefill chunk.

    checks = FiniteChecks(model, decoder.hidden, decoder.active)   # the decoder's static state
    checks.diagnose(slot, rows)                   # "non-finite: hidden; 2 modules, first [...]": a failed take's log
    checks.nonfinite(slot, rows)                  # "" when the slot's state is finite
    checks.after_chunk(prefill, after, end, hidden)   # RETAKE_CHECK_FINITE: logged once per prefill

Design choices:
- Every check reads the device (a sync), so none runs on a take's path unless asked for:
  `diagnose` only after a take's logits went non-finite, the chunk checks only under
  RETAKE_CHECK_FINITE (decoder.py wraps the prefix cache's record with them).
- Each names modules in model order, the first few: where it went wrong first is what
  whoever debugs the step needs (seen on the H200 at 16 and 64 directors, 2026-12-03).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.model import Drama3Model
from engine.drama3.prefill import Prefill

log = logging.getLogger("retake.engine")

CHECK_FINITE = os.environ.get("RETAKE_CHECK_FINITE") == "1"


class FiniteChecks:
    """The non-finite checks of one model's slots."""

    def __init__(self, model: Drama3Model, hidden: torch.Tensor, active: torch.Tensor) -> None:
        self.model = model
        self.hidden, self.active = hidden, active  # the decoder's per-slot hidden state [N, D] and mask [N]
        self.reported: set[int] = set()  # slots whose prefill logged a non-finite state

    def diagnose(self, slot: int, rows: int) -> str:
        """Which of the slot's state holds non-finite values (its hidden state, its first
        `rows` cache rows: those the last step did not write, its DeltaNet states): for the log
        of a take whose logits went non-finite."""
        found = ("" if bool(self.hidden[slot].isfinite().all()) else "hidden; ") + self.nonfinite(slot, rows)
        return "non-finite: " + (found or "none of hidden, KV rows, DeltaNet states")

    def nonfinite(self, slot: int, rows: int) -> str:
        """The slot's modules (in model order) whose state or first `rows` cache rows hold
        non-finite values, the first few; "" when all is finite."""
        bad = []
        for name, module in self.model.named_modules():
            cache = getattr(module, "kv_cache", None)
            tensors = [cache.k[slot, :rows], cache.v[slot, :rows]] if cache is not None else []
            if isinstance(module, GatedDeltaNet):
                tensors += [module.recurrent_state[slot], module.conv_state[slot]]
            if tensors and not all(bool(t.isfinite().all()) for t in tensors):
                bad.append(name)
        return "" if not bad else f"{len(bad)} modules, first {bad[:4]}"

    def after_chunk(self, prefill: Prefill, after: Callable[[int, torch.Tensor], None] | None, end: int,
                    hidden: torch.Tensor) -> None:
        """After a prefill chunk ending at row `end`: log where the slot's state first went
        non-finite (once per prefill), then `after` (the prefix cache's record)."""
        if prefill.slot not in self.reported:
            finite = bool(hidden.isfinite().all())
            bad = self.nonfinite(prefill.slot, end)
            if bad or not finite:
                self.reported.add(prefill.slot)
                log.warning("slot %d: prefill chunk ending at row %d of %d (resumed at %d; %d chunks left; %d takes "
                            "active) left a non-finite state: hidden %s; %s", prefill.slot, end, len(prefill.rows),
                            prefill.cached, len(prefill.chunks), int(self.active.sum()),
                            "finite" if finite else "non-finite", bad or "no layer state")
        if after is not None:
            after(end, hidden)

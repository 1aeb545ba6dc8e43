"""Python's garbage collector while `retake serve` serves: the warm-up's objects frozen, long
collections logged.

    frozen = collector.freeze()   # after the engines' warm-up, before serving

Design choices:
- After the warm-up the process holds a great many long-lived objects (the modules,
  torch.compile's graphs and guards, the CUDA graphs' Python side), and each collection of the
  oldest generation walks them all while every thread waits for the GIL: the engine loop, the
  vocoder's thread, the event loop that answers directors. `gc.freeze()` moves them to a
  permanent generation that collections skip (CPython's advice for servers; vLLM and SGLang
  freeze after their warm-up as well). Collected first, so only live objects are frozen.
- Why now: on stop 57's H100 two servers' event loops did not answer six directors' take
  requests for up to 333 ms, each right after the first take of a load, for a reason the logs
  did not tell. A full collection is one candidate: `Watch` logs every collection that holds
  the threads `LONG_S` or more, with its generation, so the next run's log says.
- Only `retake serve` freezes; servers built inside the test process do not (frozen objects
  are never freed, and the tests start many servers in one process).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("retake")

LONG_S = 0.05  # a collection holding the threads this long is logged (a frame is 46 ms)


class Watch:
    """A `gc.callbacks` entry: each collection's time; the ones of `long_s` or more logged."""

    def __init__(self, long_s: float = LONG_S) -> None:
        self.long_s = long_s
        self.started = 0.0
        self.long = 0  # collections that held the threads long_s or more
        self.longest_s = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        held = time.perf_counter() - self.started
        if held >= self.long_s:
            self.long += 1
            self.longest_s = max(self.longest_s, held)
            log.info("garbage collection: generation %d held every thread %.0f ms (%d objects collected)",
                     info["generation"], held * 1000, info["collected"])


def freeze() -> int:
    """Collect, freeze what is left, and watch later collections (once a process); the number of
    objects frozen."""
    gc.collect()
    gc.freeze()
    if not any(isinstance(callback, Watch) for callback in gc.callbacks):
        gc.callbacks.append(Watch())
    return gc.get_freeze_count()

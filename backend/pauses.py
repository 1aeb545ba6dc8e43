"""What holds the server's threads: Python's garbage collector (the warm-up's objects frozen,
long collections logged) and the event loop (a stall logged with what it was running).

    frozen = pauses.freeze()          # `retake serve`: after the engines' warm-up, before serving
    watch = LoopWatch(); watch.start(asyncio.get_running_loop()) ... watch.stop()   # the app's lifespan

Design choices:
- Why: on stop 57's H100 two servers' event loops did not answer six directors' take requests
  for up to 333 ms, each right after the first take of a load, and the logs did not say why.
  This module makes the next run's log say.
- The collector: after the warm-up the process holds a great many long-lived objects (the
  modules, torch.compile's graphs and guards, the CUDA graphs' Python side), and each
  collection of the oldest generation walks them all while every thread waits for the GIL: the
  engine loop, the vocoder's thread, the event loop that answers directors. `gc.freeze()`
  moves them to a permanent generation that collections skip (CPython's advice for servers;
  vLLM and SGLang freeze after their warm-up too), after a collection so only live objects
  are frozen. Only `retake serve` freezes: frozen objects are never freed, and the tests start
  many servers in one process. `CollectorWatch` logs each collection of `LONG_S` or more.
- The event loop: a beat every TICK_S on the loop, and a thread that, when the beat is HELD_S
  late, takes the loop thread's stack (what holds it, unless it holds the GIL: then the
  collector's line or nothing). When the beat comes back, one line: how long, and that stack.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("retake")

LONG_S = 0.05  # a collection holding the threads this long is logged (a frame is 46 ms)
TICK_S = 0.02  # the event loop's beat
HELD_S = 0.1  # a beat this late: the loop is held (its stack is taken, the stall logged)


class CollectorWatch:
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
    if not any(isinstance(callback, CollectorWatch) for callback in gc.callbacks):
        gc.callbacks.append(CollectorWatch())
    return gc.get_freeze_count()


class LoopWatch:
    """The event loop's beat, and a thread that logs a stall with the loop's stack."""

    def __init__(self, held_s: float = HELD_S) -> None:
        self.held_s = held_s
        self.last = time.monotonic()
        self.stack: list[str] | None = None  # the loop thread's stack, taken while it was held
        self.stalls: list[float] = []  # seconds each logged stall lasted
        self.done = threading.Event()
        self.task: asyncio.Task[None] | None = None
        self.thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        loop_thread = threading.get_ident()  # (called on the loop's thread)
        self.task = loop.create_task(self.beat())
        self.thread = threading.Thread(target=self.watch, args=(loop_thread,), name="retake-loop-watch",
                                       daemon=True)
        self.thread.start()

    async def beat(self) -> None:
        while True:
            now = time.monotonic()
            if (late := now - self.last - TICK_S) >= self.held_s:
                self.stalls.append(late)
                where = "".join(self.stack or ["  (not taken: the thread holding the loop held the GIL)\n"])
                log.info("event loop held %.0f ms (directors' messages waited); it was running:\n%s",
                         late * 1000, where.rstrip())
            self.last, self.stack = now, None
            await asyncio.sleep(TICK_S)

    def watch(self, loop_thread: int) -> None:
        while not self.done.wait(self.held_s / 4):
            if self.stack is None and time.monotonic() - self.last - TICK_S >= self.held_s:
                frame = sys._current_frames().get(loop_thread)
                self.stack = traceback.format_stack(frame, limit=8) if frame is not None else None

    def stop(self) -> None:
        self.done.set()
        if self.task is not None:
            self.task.cancel()
        if self.thread is not None:
            self.thread.join()

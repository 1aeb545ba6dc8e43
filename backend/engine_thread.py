"""What both engine loops share (the Drama 3 take loop and the PersonaPlex conversation loop):
one thread that loads and owns an engine, and the way it hands results to the event loop.

    class MyLoop(EngineThread[Engine]):
        def _ready(self, engine): ...     # on the engine thread, before start() returns (warm-up)
        def _serve(self, engine): ...     # the loop; returns once self._stopping is set
    loop = MyLoop(load, "name"); engine = loop.start(); ...; loop.stop()

Design choices:
- The engine is loaded, prepared and used by its thread only (a CUDA context, graphs and
  caches live there); `start` waits for it and raises in the caller's thread what loading
  raised, so `retake serve` reports a bad checkpoint in one line before it listens.
- The event loop and the engine thread meet under one `threading.Condition`: the event loop
  queues work and notifies; the thread waits for work, or for `stop`.
- The engine thread never touches asyncio objects: it posts callbacks with
  `call_soon_threadsafe` (`post`), which fails once the event loop is closed (the server
  stopped), and then nobody listens any more.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

E = TypeVar("E")


def post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> bool:
    """Run `fn(*args)` on the event loop, from an engine thread; False if the event loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the event loop is closed: the server stopped
        return False
    return True


class EngineThread(Generic[E]):
    """A thread that loads an engine, prepares it, then serves until `stop`."""

    def __init__(self, load: Callable[[], E], name: str) -> None:
        self._load = load
        self.engine: E | None = None
        self._condition = threading.Condition()
        self._stopping = False
        self._loaded: Future[E] = Future()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> E:
        """Start the thread; wait until the engine is loaded and ready. Raises what loading raised."""
        self._thread.start()
        return self._loaded.result()

    def stop(self) -> None:
        """Stop serving (`_stopped` runs first, under the lock); waits for the thread a while."""
        with self._condition:
            self._stopping = True
            self._stopped()
            self._condition.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _main(self) -> None:
        try:
            engine = self.engine = self._load()
            self._ready(engine)
        except BaseException as error:  # noqa: BLE001 - raised by start() in the caller's thread
            self._loaded.set_exception(error)
            return
        self._loaded.set_result(engine)
        self._serve(engine)

    def _ready(self, engine: E) -> None:
        """On the engine thread, once loaded and before `start` returns (e.g. a warm-up)."""

    def _stopped(self) -> None:
        """Under the lock, when `stop` is called (e.g. cancel the work in flight)."""

    def _serve(self, engine: E) -> None:
        raise NotImplementedError

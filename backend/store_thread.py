"""The one thread that talks to the store, so the event loop never waits for a disk.

    value = await state.db.run(store.lines, session_id)        # a read or a write, awaited
    state.db.then(loop, write, announce, failed)               # a take's write, then its message

Design choices:
- Every store call from the server goes through here: a disk that is slow, frozen (fsfreeze)
  or full then holds up only the calls waiting for it, never the event loop, so every other
  socket is still read and answered (pings, cancels, audio).
- One worker thread: calls run in the order they were made, so "written before announced"
  stays a matter of order. `run` is for handlers (they await the result); `then` is for
  callbacks that cannot await (a take's events from the engine thread): the write runs on the
  store thread, and `announce` (or `failed`, with the exception) runs on the event loop after
  it, in the order the writes were made.
- A write that fails (a full disk) raises in the caller (`run`) or reaches `failed` (`then`);
  `problem` says it in a line a director can act on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from backend.engine_thread import post

T = TypeVar("T")


class StoreThread:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the store thread."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def then(self, loop: asyncio.AbstractEventLoop, write: Callable[[], object], announce: Callable[[], None],
             failed: Callable[[BaseException], None]) -> None:
        """Run `write` on the store thread, then `announce()` on the event loop (`failed(error)` if
        the write raised)."""
        def settle(done: Future[object]) -> None:
            error = done.exception()
            if error is None:
                post(loop, announce)
            else:
                post(loop, failed, error)

        self.pool.submit(write).add_done_callback(settle)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def problem(error: BaseException) -> str:
    """A failed store call, in a line: a full disk says so."""
    text = " ".join(str(getattr(error, "orig", None) or error).split())
    if "disk is full" in text or "No space left" in text or "could not extend file" in text:
        return "the server's disk is full, so this could not be stored; free space on the server and try again"
    return f"the server could not store this ({type(error).__name__}: {text[:200]})"

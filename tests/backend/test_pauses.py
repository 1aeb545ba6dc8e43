"""What holds the server's threads (backend/pauses.py): the garbage collector's watch on real
collections of this process, and a real event loop held by a blocking call; `retake serve`'s
freeze is checked through a real server's log (test_commands.py)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from backend.pauses import CollectorWatch, LoopWatch


def logged(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    """The lines this test's watch logged (servers of other tests, still running in this process
    on a loaded machine, may log their own stalls meanwhile)."""
    return [record.getMessage() for record in caplog.records
            if record.name == "retake" and record.getMessage().startswith(start)]


def collect_watched(watch: CollectorWatch) -> None:
    gc.callbacks.append(watch)
    try:
        gc.collect()  # a full collection: generation 2
    finally:
        gc.callbacks.remove(watch)


def test_a_collection_past_the_bound_is_logged_with_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    watch = CollectorWatch(long_s=0.0)
    with caplog.at_level(logging.INFO, logger="retake"):
        collect_watched(watch)
    assert watch.long == 1 and watch.longest_s > 0
    (line,) = logged(caplog, "garbage collection:")
    assert line.startswith("garbage collection: generation 2 held every thread "), line
    assert line.endswith(" objects collected)"), line


def test_a_short_collection_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    watch = CollectorWatch(long_s=3600.0)
    with caplog.at_level(logging.INFO, logger="retake"):
        collect_watched(watch)
    assert watch.long == 0 and watch.longest_s == 0
    assert not logged(caplog, "garbage collection:")


def parse_the_whole_script() -> None:
    """A handler that forgets to leave the event loop (time.sleep releases the GIL, as a slow
    C call would not: the watch's thread runs meanwhile)."""
    time.sleep(1.0)


def test_a_held_event_loop_is_logged_with_what_held_it(caplog: pytest.LogCaptureFixture) -> None:
    async def serve() -> LoopWatch:
        watch = LoopWatch(held_s=0.2)
        watch.start(asyncio.get_running_loop())
        try:
            await asyncio.sleep(0.1)  # beats on time
            parse_the_whole_script()
            await asyncio.sleep(0.1)  # the beat comes back, and says so
        finally:
            watch.stop()
        return watch

    with caplog.at_level(logging.INFO, logger="retake"):
        watch = asyncio.run(serve())
    assert any(stall >= 0.8 for stall in watch.stalls), watch.stalls  # (a loaded machine may add short ones)
    lines = logged(caplog, "event loop held ")
    # the loop thread's stack, taken while it was held
    assert any("in parse_the_whole_script" in line for line in lines), lines

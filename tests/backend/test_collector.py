"""The garbage collector's watch (backend/collector.py), on real collections of this process;
`retake serve`'s freeze is checked through a real server's log (test_commands.py)."""

from __future__ import annotations

import gc
import logging

import pytest

from backend.collector import Watch


def collect_watched(watch: Watch) -> None:
    gc.callbacks.append(watch)
    try:
        gc.collect()  # a full collection: generation 2
    finally:
        gc.callbacks.remove(watch)


def test_a_collection_past_the_bound_is_logged_with_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch(long_s=0.0)
    with caplog.at_level(logging.INFO, logger="retake"):
        collect_watched(watch)
    assert watch.long == 1 and watch.longest_s > 0
    (line,) = [record.getMessage() for record in caplog.records if record.name == "retake"]
    assert line.startswith("garbage collection: generation 2 held every thread "), line
    assert line.endswith(" objects collected)"), line


def test_a_short_collection_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch(long_s=3600.0)
    with caplog.at_level(logging.INFO, logger="retake"):
        collect_watched(watch)
    assert watch.long == 0 and watch.longest_s == 0
    assert not [record for record in caplog.records if record.name == "retake"]

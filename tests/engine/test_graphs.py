"""StepGraphs' routing by replay time, where no GPU runs the graphs (a CPU: the step runs eagerly)."""

from __future__ import annotations

import pytest

from engine.graphs import StepGraphs


def test_a_length_runs_in_the_smallest_bucket_that_fits_until_replays_are_timed() -> None:
    graphs = StepGraphs(lambda n: None, [1, 2, 32, 64], enabled=False)
    assert [graphs.fastest_for(n) for n in (1, 2, 3, 20, 33, 64)] == [1, 2, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="largest bucket 64"):
        graphs.fastest_for(65)


def test_a_length_runs_in_the_fastest_timed_bucket_that_fits() -> None:
    graphs = StepGraphs(lambda n: None, [1, 2, 32, 64], enabled=False)
    graphs.replay_ms = {1: 2.7, 2: 3.0, 32: 9.7, 64: 7.6}  # an H100's codec windows after 320 frames
    assert [graphs.fastest_for(n) for n in (1, 2, 3, 20, 33, 64)] == [1, 2, 64, 64, 64, 64]
    graphs.replay_ms = {1: 2.7, 32: 9.7}  # 2 and 64 untimed (never captured): routed among the timed
    assert [graphs.fastest_for(n) for n in (1, 2, 20)] == [1, 32, 32]

"""The admission budget (admission.py): prompt rows a step may prefill while takes decode,
from the measured step times, so a step stays within most of a frame."""

from __future__ import annotations

import pytest

from engine.drama3.admission import Admission

FRAME_S = 2048 / 44100  # 46.4 ms


def test_before_any_step_is_measured_the_budget_is_the_start_rows() -> None:
    budget = Admission(FRAME_S)
    assert budget.rows() == budget.start_rows
    budget.record(0.030, 256)  # a prefilling step before any plain one: nothing to compare it with
    assert budget.rows() == budget.start_rows and budget.row_s is None


def test_the_budget_fills_what_is_left_of_three_quarters_of_a_frame() -> None:
    budget = Admission(FRAME_S)
    budget.record(0.010, 0)  # a step of the takes alone: 10 ms
    budget.record(0.030, 400)  # 400 rows beside it: 20 ms, 50 us a row
    assert budget.decode_s == pytest.approx(0.010) and budget.row_s == pytest.approx(50e-6)
    assert budget.rows() == int((0.75 * FRAME_S - 0.010) / 50e-6)  # 495 rows


def test_slow_steps_still_admit_a_few_rows_and_fast_ones_are_capped() -> None:
    budget = Admission(FRAME_S)
    budget.record(0.060, 0)  # the takes alone already take longer than a frame
    budget.record(0.080, 100)
    assert budget.rows() == budget.min_rows
    fast = Admission(FRAME_S)
    fast.record(0.002, 0)
    fast.record(0.001, 512)  # no measurable cost beside the step
    assert fast.row_s == 0 and fast.rows() == fast.max_rows


def test_the_averages_follow_a_change_of_load() -> None:
    budget = Admission(FRAME_S)
    budget.record(0.010, 0)
    budget.record(0.020, 200)  # 50 us a row
    before = budget.rows()
    for _ in range(30):  # more takes decoding: 25 ms steps, rows as dear as before
        budget.record(0.025, 0)
        budget.record(0.025 + 200 * 50e-6, 200)
    assert budget.decode_s == pytest.approx(0.025, rel=0.01)
    assert budget.rows() < before
    assert budget.rows() == pytest.approx((0.75 * FRAME_S - 0.025) / 50e-6, rel=0.05)

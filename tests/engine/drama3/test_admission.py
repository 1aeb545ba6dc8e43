"""The admission budget (admission.py): prompt rows a step may prefill while takes decode,
from the measured step times, so a step stays within most of a frame."""

from __future__ import annotations

import pytest

from engine.drama3.admission import HAND_OUT_STEPS, Admission, Carrying, Playing, playback_limit

FRAME_S = 2048 / 44100  # 46.4 ms


def test_before_any_step_is_measured_the_budget_is_the_start_rows() -> None:
    budget = Admission(FRAME_S)
    assert budget.rows() == budget.start_rows
    budget.record(0.030, 256)  # a prefilling step before any plain one: nothing to compare it with
    assert budget.rows() == budget.start_rows and budget.row_s is None
    # A playing take's limit holds before that: none when it is late, a few rows (which
    # measure a row) when it leaves room.
    assert budget.rows(-0.01) == 0 and budget.rows(0.001) == budget.min_rows


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


def test_a_take_early_in_its_stream_limits_the_step_and_the_prefill_gets_what_is_left() -> None:
    budget = Admission(FRAME_S)
    budget.record(0.010, 0)
    budget.record(0.030, 400)  # 50 us a row
    # Sent 4 frames (186 ms), 60 ms of them played; 6 frames to its next window (at 10): the
    # window leaves after 6 + 2 steps, so no step may take more than 126 / 8 ms.
    early = Playing(ahead_s=4 * FRAME_S - 0.060, frames=6)
    settled = Playing(ahead_s=2.0, frames=64)  # far ahead: allows 2.0 / 66 s, not the tightest
    limit = playback_limit([settled, early])
    assert limit == pytest.approx((4 * FRAME_S - 0.060) / (6 + HAND_OUT_STEPS))
    assert budget.rows(limit) == int((limit - 0.010) / 50e-6)  # below the 3/4-frame budget
    assert budget.rows(limit) < budget.rows()
    assert budget.rows(1.0) == budget.rows()  # a looser limit than 3/4 of a frame changes nothing
    assert playback_limit([]) is None and budget.rows(None) == budget.rows()


def test_no_row_is_prefilled_when_a_playing_take_has_no_time_to_spare() -> None:
    budget = Admission(FRAME_S)
    budget.record(0.010, 0)
    budget.record(0.030, 400)
    late = playback_limit([Playing(ahead_s=-0.020, frames=3)])  # its audio already ran out
    assert late is not None and late < 0 and budget.rows(late) == 0
    tight = playback_limit([Playing(ahead_s=0.050, frames=3)])  # 10 ms a step: the frame alone
    assert budget.rows(tight) == 0
    # A few rows' worth is not worth a chunk that could take longer: none either.
    assert budget.rows(0.010 + (budget.min_rows - 1) * 50e-6) == 0
    assert budget.rows(0.010 + (budget.min_rows + 0.5) * 50e-6) == budget.min_rows


def test_where_steps_alone_cannot_outpace_playback_the_limit_is_not_applied() -> None:
    budget = Admission(FRAME_S)
    budget.record(0.040, 0)  # the takes alone: 40 ms a step, more than 3/4 of a frame
    budget.record(0.060, 400)
    late = playback_limit([Playing(ahead_s=0.0, frames=5)])
    # Holding the prompts back would hold them until the playing takes end: they get the
    # plain budget, a few rows a step.
    assert budget.rows(late) == budget.rows() == budget.min_rows


def test_a_step_carries_the_largest_chunk_the_playing_takes_allow() -> None:
    budget = Admission(FRAME_S)
    carrying = Carrying(budget)
    assert carrying.size((64, 256)) == 256  # nothing measured, nobody playing: the largest
    carrying.record(256, 0.030)  # before a plain step is measured: nothing to compare it with
    assert carrying.extra_s == {}
    budget.record(0.010, 0)  # the takes alone: 10 ms
    carrying.record(256, 0.027)  # 17 ms more with 256 rows
    assert carrying.extra_s == {256: pytest.approx(0.017)}
    assert carrying.size((64, 256), limit_s=0.030) == 256  # 20 ms spare: it fits
    assert carrying.size((64, 256), limit_s=0.020) == 64  # 10 ms spare: only the unmeasured size, which measures it
    carrying.record(64, 0.0225)  # 12.5 ms more with 64 rows
    assert carrying.size((64, 256), limit_s=0.020) is None  # neither fits: the prompt waits a step
    assert carrying.size((64, 256), limit_s=0.025) == 64
    assert carrying.size((64, 256), limit_s=None) == 256  # nobody playing
    budget.record(0.040, 0)  # an overloaded step: waiting would not let the takes gain, so no limit applies
    budget.decode_s = 0.040
    assert carrying.size((64, 256), limit_s=0.020) == 256

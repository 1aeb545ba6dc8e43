"""The busy retry hint (queue_wait.py): the takes ahead laid on the slots in start order at
the measured frame rate, and the lengths and rates learnt from the takes that ended."""

from __future__ import annotations

import pytest

from backend.directing.queue_wait import FRAMES_PER_CHAR, NEW_WEIGHT, QueueWait, queue_wait


def test_one_slot_waits_for_what_is_ahead() -> None:
    # A take with 3 s left in the slot, two queued takes of 2 s each behind it.
    assert queue_wait([3.0], [(2.0, True), (2.0, True)], slots=1, need=1) == 3.0
    assert queue_wait([3.0], [(2.0, True), (2.0, True)], slots=1, need=2) == 5.0
    assert queue_wait([3.0], [(2.0, True)], slots=1, need=0) == 0.0  # room already


def test_slots_free_in_turn() -> None:
    # Slots free at 1 s and 4 s; the first queued take starts at 1 s and ends at 3 s, before the other slot.
    assert queue_wait([1.0, 4.0], [(2.0, True), (2.0, True), (2.0, True)], slots=2, need=2) == 3.0
    assert queue_wait([], [(2.0, True), (2.0, True)], slots=2, need=2) == 0.0  # free slots: they start at once


def test_a_take_between_attempts_holds_a_slot_but_no_place_in_the_queue() -> None:
    assert queue_wait([], [(5.0, False), (1.0, True)], slots=1, need=1) == 5.0
    assert queue_wait([2.0], [], slots=1, need=1) == 2.0  # calls only: room when the slot frees


def test_lengths_and_rates_are_learnt_from_takes_that_ended() -> None:
    wait = QueueWait(frame_rate=20.0)
    assert wait.expected_frames(10, 1200) == round(10 * FRAMES_PER_CHAR)
    assert wait.expected_frames(10_000, 1200) == 1200  # at most max_new_tokens
    assert wait.expected_frames(0, 300) == 300  # no text known
    assert wait.remaining_frames(10, 1200, done=5) == 10
    assert wait.remaining_frames(10, 1200, done=200) == 500  # past its length: halfway to max_new_tokens
    wait.finished(chars=10, frames=40, frames_per_s=30.0, stopped=True)
    assert wait.frame_rate == pytest.approx(20 + NEW_WEIGHT * 10)
    assert wait.frames_per_char == pytest.approx(FRAMES_PER_CHAR + NEW_WEIGHT * (4 - FRAMES_PER_CHAR))
    wait.finished(chars=10, frames=1200, frames_per_s=None, stopped=False)  # capped: says nothing of the length
    assert wait.frames_per_char == pytest.approx(FRAMES_PER_CHAR + NEW_WEIGHT * (4 - FRAMES_PER_CHAR))

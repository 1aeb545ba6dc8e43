"""Early windows (take.py): where a take's client would run out of audio before its next
scheduled window, the take closes a window with the frames it has. Here every decode step
is made to take longer than a frame plays (a real step, then a sleep), so after its first
audio a take's client is always short: its windows close early, its Done says where, and
its export with those cuts is its stream, sample for sample; without early windows the
same take sends the schedule's windows only."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine import AudioWindow, Done, EngineSpec, Sampling, load_engine
from engine.drama3.stream import take_windows

SLOW_STEP_S = 0.1  # over twice a frame (46 ms): no client gets ahead, whatever the vocoder thread lags


@pytest.fixture(scope="module")
def early(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", early_windows=True))


@pytest.fixture(scope="module")
def scheduled(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))


def slow_steps(engine, monkeypatch) -> list[int]:
    """Each decode step then a sleep; the frames a playing take had to decode before its next
    window, as the admission's playback limit saw them, at each step."""
    step, frames = engine.decoder.step, []

    def slow(*args, **kwargs):
        step(*args, **kwargs)
        time.sleep(SLOW_STEP_S)
        now = time.perf_counter()
        frames.extend(playing.frames for take in engine.slot_table.decoding() if (playing := take.playing(now)))

    monkeypatch.setattr(engine.decoder, "step", slow)
    return frames


def take(engine, seed: int = 3) -> tuple[list[AudioWindow], Done]:
    prompt = engine.prompt("Slowly, as if the room were full.", None, [], Sampling(max_new_tokens=24, seed=seed))
    events = list(engine.generate(prompt))
    assert isinstance(events[-1], Done) and all(isinstance(e, AudioWindow) for e in events[:-1])
    return events[:-1], events[-1]


def test_early_windows_are_off_on_a_cpu_unless_asked(early, scheduled):
    assert early.early_windows and not scheduled.early_windows


def test_a_client_short_of_audio_gets_the_frames_there_are(early, scheduled, monkeypatch):
    before_window = slow_steps(early, monkeypatch)
    early.pace_report()  # (from here on)
    windows, done = take(early)
    assert done.finish_reason == "length" and done.codes.shape[1] == 24
    frames = [w.frames for w in windows]
    ends = list(np.cumsum(frames))
    # The first window is the schedule's (nothing plays before it); after it every step's frame goes out
    # at once, the client never ahead by the 3 steps (one, then vocode and hand-out) a window takes.
    assert frames[0] == 1 and frames[1:-1] == [1] * (len(frames) - 2)
    assert list(done.cuts) == [end for end in ends[:-1] if end not in (1, 2, 4, 10, 20)]
    assert [w.frames for w in take_windows(24, 1, done.cuts)] == frames  # the export's windows: the stream's
    assert np.array_equal(np.concatenate([w.pcm for w in windows]), early.vocode_take(done.codes, done.cuts))
    # the server's pace line counts them
    assert f"({len(done.cuts)} closed early)" in (early.pace_report() or "")
    # A take that can close a window after any step: the admission's limit plans one step ahead, not to its next end.
    assert before_window and set(before_window) == {1}

    before_window = slow_steps(scheduled, monkeypatch)
    windows, plain = take(scheduled)
    assert np.array_equal(plain.codes, done.codes) and plain.cuts == ()
    assert [w.frames for w in windows] == [w.frames for w in take_windows(24, 1)]  # 1, 1, 2, 6, 10, 4
    assert max(before_window) > 1

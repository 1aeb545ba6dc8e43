"""How long a full engine queue keeps a new take out: the `busy` reply's retry hint.

    wait = QueueWait(frame_rate=20.0)                    # per-take frames/s, measured as takes end
    wait.expected_frames(job)                            # a take's guessed length
    seconds = queue_wait(running_s, waiting, slots, need)

Design choices:
- The hint is estimated from what is ahead, not from the last take alone: the takes in
  the slots (their expected frames left) and the takes waiting in start order (their
  expected frames), laid on the slots as the loop would start them, at the measured
  frame rate of a take decoding among others. A retry fits once enough waiting takes
  have left the queue for one more to fit (`need`); that start time is the hint.
- A take's expected length: its text's characters times the frames per character of
  recent takes that ended by themselves (`stop`), at most its `max_new_tokens`; with no
  text known, its `max_new_tokens`. A running take already past its expected length is
  taken to be halfway from where it is to its `max_new_tokens`.
- Both rates are moving averages of finished takes (weight NEW_WEIGHT each), so the hint
  follows the machine and the model; before the first take the warm-up's step time gives
  the frame rate, and FRAMES_PER_CHAR (spoken English: ~14 characters a second at 21.5
  frames a second) the length.
- Calls (encode a reference, vocode an export) run between steps: they leave the queue at
  once, so they count as room soon.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

FRAMES_PER_CHAR = 1.5  # before a take has ended by itself: ~21.5 frames/s over ~14 characters/s
FRAME_RATE = 20.0  # frames/s of one take, before the warm-up has measured the step
NEW_WEIGHT = 0.3  # of a finished take in the moving averages
SOON_S = 0.1  # the least hint: the queue has room as soon as the loop turns


@dataclass
class QueueWait:
    """The measured rates the estimate uses (updated on the engine thread as takes end)."""

    frame_rate: float = FRAME_RATE  # frames/s of a take decoding among the others
    frames_per_char: float = FRAMES_PER_CHAR

    def expected_frames(self, chars: int, max_new_tokens: int) -> int:
        """A take's guessed length in frames: its text's at the measured rate, at most max_new_tokens."""
        if chars <= 0:
            return max_new_tokens
        return max(1, min(max_new_tokens, math.ceil(chars * self.frames_per_char)))

    def remaining_frames(self, chars: int, max_new_tokens: int, done: int) -> int:
        """Frames a running take has left: to its expected length, or, past it, halfway to max_new_tokens."""
        left = self.expected_frames(chars, max_new_tokens) - done
        return left if left > 0 else max(1, (max_new_tokens - done) // 2)

    def finished(self, chars: int, frames: int, frames_per_s: float | None, stopped: bool) -> None:
        """Fold a finished take in: its decode rate, and its frames per character if it ended by itself."""
        if frames_per_s is not None and math.isfinite(frames_per_s) and frames_per_s > 0:
            self.frame_rate += NEW_WEIGHT * (frames_per_s - self.frame_rate)
        if stopped and chars > 0 and frames > 0:
            self.frames_per_char += NEW_WEIGHT * (frames / chars - self.frames_per_char)


def queue_wait(running_s: Sequence[float], waiting: Sequence[tuple[float, bool]], slots: int, need: int) -> float:
    """Seconds until `need` queued takes have started. `running_s`: the seconds each take in a
    slot has left; `waiting`: (seconds, queued) of each waiting take in start order (`queued`
    False: a take between attempts, which holds no place in the queue); `slots`: takes that
    decode together."""
    if need <= 0:
        return 0.0
    free_at = sorted(running_s)[:slots] + [0.0] * max(0, slots - len(running_s))  # when each slot frees
    heapq.heapify(free_at)
    started = 0
    for seconds, queued in waiting:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + seconds)
        started += queued
        if started >= need:
            return start
    return min(free_at)  # fewer queued takes than needed (the rest are calls): the next slot to free

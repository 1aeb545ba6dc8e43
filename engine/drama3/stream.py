"""Streaming a take: which window of frames to vocode when.

Design choices:
- The schedule is the seed's (SGLang Omni's): windows close when 10, 20, 32, 64, 128,
  192, ... frames exist (strides 10, 10, 12, 32, then 64). An optional first window of f
  frames closes earlier; the ends then double (f, 2f, 4f, ...) while a doubled end is at
  most STREAM_STRIDE / 2, and the seed's ends beyond the last one follow: 1, 2, 4, 10,
  20, ... for f=1; 3, 10, 20, ... for f=3; 4, 10, 20, ... for f=4. Each window is
  decoded while the windows before it play, and doubling keeps the frames to decode no
  more than the frames already sent (1 then 10 would decode 9 frames while 1 frame, 46
  ms, plays: the client stalls). Stopping at half of 10 keeps the window that joins the
  seed's ends at least as long as the ramp's last end (no 8 then 10: a codec call for 2
  frames); that join asks a little more than doubling (4 then 10 decodes 6 frames with 4
  sent; 3 then 10, 7 with 3). `window_ends` is a pure function; `StreamSchedule` only
  remembers how far a take has been emitted.
- A window is the take's frames [emit, end): it decodes them after the frames before it,
  through the take's codec state (codec_stream.py: the post transformer's keys and values,
  the last transformed frames), so the concatenated windows are the whole take's decode,
  with exactly its sample count, no gap and no overlap. The seed decoded each window again
  with 320 frames of left context instead (~50 dB from the whole take, and hundreds of
  frames through the transformer for each window).
- A window is always decoded the same way from the same codes and state, so `render_take`
  (codec_graphs.py, the WAV export) reproduces the streamed PCM16 sample for sample by
  replaying the schedule. On CUDA a window decodes as the replay of a CUDA graph of its
  frame count (codec_graphs.py; `window_frames` lists the counts to capture). This module
  knows nothing of the codec or graphs: the schedule stays pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from engine.errors import RequestError

STREAM_STRIDE = 10  # frames in the first window
STREAM_FOLLOWUP_STRIDE_RAMP = (10, 12, 32)  # the next three windows
STREAM_FOLLOWUP_STRIDE = 64  # every window after those


def window_ends(first_window: int | None = None) -> Iterator[int]:
    """Frame counts at which windows close: 10, 20, 32, 64, 128, 192, ... (endless).

    With `first_window` f: f, then f doubled while that is at most STREAM_STRIDE / 2, then
    the seed's ends beyond the last of those: 1, 2, 4, 10, 20, ... (f=1), 2, 4, 10, ...
    (f=2), 3, 10, ... (f=3), 15, 20, 32, ... (f=15). A window is decoded while the ones
    before it play; doubling keeps its frames to decode no more than the frames already sent.
    """
    strides = itertools.chain((STREAM_STRIDE,), STREAM_FOLLOWUP_STRIDE_RAMP,
                              itertools.repeat(STREAM_FOLLOWUP_STRIDE))
    ends = itertools.accumulate(strides)
    if first_window is None:
        return ends
    if first_window < 1:
        raise ValueError(f"a first window must be at least 1 frame; got {first_window}")
    ramp = [first_window]
    while 2 * ramp[-1] <= STREAM_STRIDE / 2:
        ramp.append(2 * ramp[-1])
    return itertools.chain(ramp, (end for end in ends if end > ramp[-1]))


def check_settings(first_window: int | None) -> None:
    if first_window is not None and (isinstance(first_window, bool) or not isinstance(first_window, int)
                                     or first_window < 1):
        raise RequestError(f"first window must be a whole number of frames >= 1; got {first_window!r}")


@dataclass(frozen=True)
class Window:
    """The take's frames [emit, end): decoded after the frames before them, their samples sent."""

    emit: int
    end: int
    last: bool = False

    @property
    def frames(self) -> int:
        """New frames this window sends (0 for an empty closing window)."""
        return self.end - self.emit


class StreamSchedule:
    """The windows of one take, as its frames arrive.

    After each new frame, the generation loop asks `while (w := schedule.due(frames))`
    for the windows that closed, then maybe `cut(frames)` for one closed early; when the
    take ends (any reason), `final(frames)` gives the closing window (marked last; empty if
    the last window closed exactly there).
    """

    def __init__(self, first_window: int | None = None) -> None:
        check_settings(first_window)
        self.emitted = 0
        self.ends = window_ends(first_window)
        self.next_end = next(self.ends)
        self.cuts: list[int] = []  # frame counts where a window closed early

    def due(self, frames: int) -> Window | None:
        """The next scheduled window, if `frames` frames reach its end; else None."""
        if frames < self.next_end:
            return None
        window = self.window(self.next_end, last=False)
        self.next_end = next(self.ends)
        return window

    def cut(self, frames: int) -> Window | None:
        """A window closed early: the frames [emitted, frames) now, before the next end (which
        stays); None where none is new or `frames` reaches the next end (`due`'s)."""
        if frames <= self.emitted or frames >= self.next_end:
            return None
        self.cuts.append(frames)
        return self.window(frames, last=False)

    def final(self, frames: int) -> Window:
        """The last window of a take of `frames` frames: what is not yet emitted."""
        if frames < self.emitted:
            raise ValueError(f"the take has {frames} frames but {self.emitted} were already emitted")
        return self.window(frames, last=True)

    def window(self, end: int, last: bool) -> Window:
        window = Window(self.emitted, end, last)
        self.emitted = end
        return window


def take_windows(frames: int, first_window: int | None = None, cuts: Sequence[int] = ()) -> list[Window]:
    """Every window a stream of a take of `frames` frames sends, the closing one included,
    with the windows it closed early at `cuts` (its Done's)."""
    schedule = StreamSchedule(first_window)
    windows: list[Window | None] = []
    for count in sorted(set(count for count in cuts if count <= frames)):  # each after the windows due there, as a take
        while (window := schedule.due(count)) is not None:
            windows.append(window)
        windows.append(schedule.cut(count))
    while (window := schedule.due(frames)) is not None:
        windows.append(window)
    windows.append(schedule.final(frames))
    return [window for window in windows if window is not None]


def first_frames(first_window: int | None = None) -> int:
    """Frames in a take's first window (a take that ends before it closes sends fewer)."""
    return next(window_ends(first_window))


def window_frames(first_window: int | None = None) -> list[int]:
    """Every frame count a take's later windows (after its first) have, in order: 1, 2, 6,
    10, 12, 32, 64 with a first window of 1; 10, 12, 32, 64 with the seed's. A take's last
    window has fewer."""
    counts: list[int] = []
    ends = window_ends(first_window)
    emitted = next(ends)
    for end in ends:
        if end - emitted not in counts:
            counts.append(end - emitted)
        if end - emitted == STREAM_FOLLOWUP_STRIDE:
            return counts  # every later window has this stride
        emitted = end
    raise AssertionError("window_ends is endless")

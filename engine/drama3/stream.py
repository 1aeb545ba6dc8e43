"""Streaming a take: which window of frames to vocode when, and its PCM16.

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
- A window decodes its new frames with up to `overlap` frames of left context and keeps
  only the new frames' samples. The codec is causal, so with enough context (the
  window-limited transformers reach hundreds of frames back; 320 frames is the seed's
  default) the concatenated windows equal a whole-take decode; they always have exactly
  its sample count, with no gap and no overlap. Only the codec's post transformer needs
  that context: its upsampling and decoder run on the new frames and `conv_context`
  frames before them (codec.py `decode_tail`), most of a window's cost.
- A window is always decoded the same way from the same codes, so `render_take`
  (codec_graphs.py, the WAV export) reproduces the streamed PCM16 sample for sample by
  replaying the schedule.
- PCM16 is engine/pcm.py's rule (rounded, clipped), converted on the codec's device so
  only int16 crosses to the host. On CUDA a window decodes as the replay of a CUDA graph
  of its length (codec_graphs.py; `window_lengths` lists the lengths to capture). This
  module knows nothing of graphs: the schedule and the eager window stay pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.drama3.codec import Codec
from engine.errors import RequestError
from engine.pcm import pcm16

STREAM_STRIDE = 10  # frames in the first window
STREAM_FOLLOWUP_STRIDE_RAMP = (10, 12, 32)  # the next three windows
STREAM_FOLLOWUP_STRIDE = 64  # every window after those
STREAM_OVERLAP_FRAMES = 320  # left context per window (SGLang Omni uses 32: ~3.5 dB SNR)


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


def check_settings(overlap: int, first_window: int | None) -> None:
    if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
        raise RequestError(f"stream overlap must be a whole number of frames >= 0; got {overlap!r}")
    if first_window is not None and (isinstance(first_window, bool) or not isinstance(first_window, int)
                                     or first_window < 1):
        raise RequestError(f"first window must be a whole number of frames >= 1; got {first_window!r}")


@dataclass(frozen=True)
class Window:
    """Frames [start, end) are decoded; the samples of frames [emit, end) are sent."""

    start: int
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
    for the windows that closed; when the take ends (any reason), `final(frames)` gives
    the closing window (marked last; empty if the last window closed exactly there).
    """

    def __init__(self, overlap: int = STREAM_OVERLAP_FRAMES, first_window: int | None = None) -> None:
        check_settings(overlap, first_window)
        self.overlap = overlap
        self.emitted = 0
        self.ends = window_ends(first_window)
        self.next_end = next(self.ends)

    def due(self, frames: int) -> Window | None:
        """The next scheduled window, if `frames` frames reach its end; else None."""
        if frames < self.next_end:
            return None
        window = self.window(self.next_end, last=False)
        self.next_end = next(self.ends)
        return window

    def final(self, frames: int) -> Window:
        """The last window of a take of `frames` frames: what is not yet emitted."""
        if frames < self.emitted:
            raise ValueError(f"the take has {frames} frames but {self.emitted} were already emitted")
        return self.window(frames, last=True)

    def window(self, end: int, last: bool) -> Window:
        start = max(0, self.emitted - self.overlap)
        window = Window(start, self.emitted, end, last)
        self.emitted = end
        return window


def take_windows(frames: int, overlap: int = STREAM_OVERLAP_FRAMES,
                 first_window: int | None = None) -> list[Window]:
    """Every window a stream of a take of `frames` frames sends, the closing one included."""
    schedule = StreamSchedule(overlap, first_window)
    windows = []
    while (window := schedule.due(frames)) is not None:
        windows.append(window)
    windows.append(schedule.final(frames))
    return windows


def window_pcm(codec: Codec, codes: torch.Tensor, window: Window) -> torch.Tensor:
    """int16 PCM [window.frames * frame_samples] of a window, on the codec's device.
    `codes` [num_codebooks, >= window.end] holds the take's frames so far."""
    if window.frames == 0:
        return torch.zeros(0, dtype=torch.int16, device=codec.device)
    start = max(0, window.emit - window.start - codec.conv_context)  # the convolutions' own context
    audio = codec.decode_tail(codes[None, :, window.start: window.end], start, window.end - window.start - start)
    return pcm16(audio[0, (window.emit - window.start - start) * codec.frame_samples:])  # [frames * frame_samples]


def window_lengths(overlap: int = STREAM_OVERLAP_FRAMES, first_window: int | None = None) -> list[int]:
    """The frames a stream's windows decode (left context + new frames), every length they
    take, in order: 4, 10, 20, 32, 64, 128, 192, 256, 320, 384 for the seed's windows with a
    first window of 4 and 320 frames of context (1, 2, 4, 10, ... with a first window of 1).
    A take's last window is shorter."""
    lengths: list[int] = []
    emitted = 0
    for end in window_ends(first_window):
        length = end - max(0, emitted - overlap)
        if length not in lengths:
            lengths.append(length)
        if end - emitted == STREAM_FOLLOWUP_STRIDE and emitted >= overlap:
            return lengths  # every later window has this stride and this full context
        emitted = end
    raise AssertionError("window_ends is endless")

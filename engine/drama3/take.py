"""One take's host side: its stop rules, its committed frames, its windows, its Done.

    take = Take(prompt, slot, codec, graphs, schedule, executor, deadline, cancelled)
    reason = take.stopped()              # before each step: cancelled / deadline
    reason = take.advance(status_row, step_s, pace_s)   # after each step: the slot's status row
    take.close(reason)                   # the slot is free; the rest of the frames go out
    events = take.ready(wait)            # AudioWindow ... then Done once everything is out

slots.py drives takes through a Decoder's slots; a take never touches the device state.

Design choices:
- Stop rules: end of speech (`stop`), `max_new_tokens` (`length`), the deadline
  (`deadline`), the cancel callback (`cancelled`), non-finite logits (`error`). Deadline
  and cancel are checked before each step, so a take ends within one step of either.
- The model often ends a turn with `<|semantic:0|>` right before end of speech, and that
  frame decodes to a click: such a frame is held back one step and dropped if end of
  speech follows (mlx-audio does the same). Every other frame is committed at once.
- Frames arrive on the host with the step's status (one read per batched step), so a
  take's codes live on the host; a window's codes go to the codec's device (on CUDA on a
  side stream, beside the decode steps) and its PCM16 comes back, both through pinned
  memory with no blocking read: decode never waits for a vocode, and a vocode never
  waits for the rest of the take (engine/readback.py, vocoder.py).
- Windows (stream.py's schedule) go to the vocoder as soon as their frames are
  committed: on its worker thread, with every other take's due windows (vocoder.py), so
  the codec runs while the next frames decode; each take hands its windows out in order.
  Each goes with the time its client runs out of the audio before it (`runs_dry`): the
  vocoder decodes the soonest first.
  The final window (marked last, possibly empty) flushes the rest whatever the finish
  reason, so the stream always carries exactly the take's committed codes. A closed
  take no longer holds its slot while its last windows vocode; Done follows them.
- Early windows (`early`): where the audio its client has yet to play (as loadtest's player
  plays it: `playing_until`) would run out before a window closed one step later could be
  heard (that step, then HAND_OUT_STEPS to vocode and hand it out, at `pace_s`, the slot
  table's recent longest step), the frames it has go out now (stream.py `cut`). On a loaded
  GPU the schedule's long windows otherwise stall the client: at 30 ms a step a 32-frame
  window takes ~1 s while the 0.56 s before it play. Before the first audio, nothing is cut:
  the first window is the schedule's. Off by default (engine.py): on an H100 (stop 46) the
  extra windows' codec calls delayed every take's windows, and 32 and 64 directors lost more
  than the schedule's stalls.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from engine.drama3.admission import HAND_OUT_STEPS, Playing
from engine.drama3.codec_stream import StreamState
from engine.drama3.prompt import Prompt
from engine.drama3.stream import StreamSchedule, Window
from engine.drama3.vocoder import Vocoder

# prompt_rows, restore_ms, cached_rows, prefill_chunks, prompt_ms, prefill_ms, first_window_steps, first_audio_ms, ...
Timings = dict[str, float | None]


@dataclass(frozen=True)
class AudioWindow:
    pcm: NDArray[np.int16]  # [N]: the window's new samples
    start_sample: int  # where pcm starts in the take
    frames: int  # new frames in this window
    last: bool  # the take's final window (possibly empty)
    codes: NDArray[np.int64]  # [num_codebooks, frames]: the new frames' codes (a server stores them as they stream)


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop" | "length" | "deadline" | "cancelled" | "error"; "prefilled" (prefill-only)
    timings: Timings
    codes: NDArray[np.int64]  # [num_codebooks, frames]: exactly what the stream carried
    error: str | None = None
    cuts: tuple[int, ...] = ()  # frame counts where its stream closed a window early (stream.py `cut`)


class Windows:
    """A take's windows, vocoded beside the decode loop and handed out in order.

    The vocoder (vocoder.py) decodes them on its worker thread, beside other takes'
    windows, while the next decode steps run; without an executor, inline."""

    def __init__(self, vocoder: Vocoder) -> None:
        self.vocoder = vocoder
        # (window, its new codes, its PCM16 or the future of it, when its PCM was on the host: [] before)
        self.pending: collections.deque[tuple[Window, NDArray[np.int64],
                                              Future[NDArray[np.int16]] | NDArray[np.int16], list[float]]]
        self.pending = collections.deque()
        self.sample = 0  # the take's samples handed out so far
        self.state = StreamState()  # the take's codec state between its windows (codec_stream.py)

    def submit(self, codes: NDArray[np.int64], window: Window, deadline: float) -> None:
        """`window` of the take's codes to the vocoder; `deadline`: when its client runs out of the
        audio before it (perf_counter: the vocoder decodes the soonest first)."""
        frames = codes[:, :window.end].copy()  # [num_codebooks, end]; a copy: later steps write after them
        new = frames[:, window.emit:]  # [num_codebooks, window.frames]
        future, decoded = self.vocoder.submit(frames, window, self.state, deadline), []
        future.add_done_callback(lambda _: decoded.append(time.perf_counter()))  # (the vocoder's thread)
        self.pending.append((window, new, future, decoded))

    def ready(self, wait: bool = False) -> Iterator[AudioWindow]:
        """The decoded windows at the head of the queue (all of them if `wait`); the pace learns how
        long each waited to be handed out after its PCM was on the host."""
        while self.pending and (wait or not isinstance(self.pending[0][2], Future) or self.pending[0][2].done()):
            window, codes, result, decoded = self.pending.popleft()
            pcm = result.result() if isinstance(result, Future) else result
            if decoded and self.vocoder.pace is not None:
                self.vocoder.pace.handed(time.perf_counter() - decoded[0])
            yield AudioWindow(pcm=pcm, start_sample=self.sample, frames=window.frames, last=window.last, codes=codes)
            self.sample += len(pcm)


class Take:
    """A take in flight: decoding in a slot, then closed (slot freed) until its Done is out."""

    def __init__(self, prompt: Prompt, slot: int, vocoder: Vocoder, schedule: StreamSchedule,
                 deadline: float | None, cancelled: Callable[[], bool] | None,
                 eos: int, semantic_start: int, stop: int | None = None, early: bool = False) -> None:
        self.started = time.perf_counter()
        # A prefill for the prefix cache alone, of the rows before `stop`: ends "prefilled", no frames.
        self.stop = stop
        self.prefill_only = stop is not None
        self.prompt, self.slot = prompt, slot
        self.deadline, self.cancelled = deadline, cancelled
        self.eos, self.semantic_start = eos, semantic_start
        self.schedule, self.windows = schedule, Windows(vocoder)
        self.early = early  # windows close early where its client would run out of audio
        self.position = len(prompt.rows) - 1  # of the next step's input frame
        self.codes = np.zeros((vocoder.codec.num_codebooks, prompt.sampling.max_new_tokens), dtype=np.int64)
        self.committed, self.held, self.steps, self.step_s = 0, False, 0, 0.0  # held: a <|semantic:0|> frame
        self.finish: str | None = None  # set when the take closes
        self.error: str | None = None
        self.done = False  # Done was handed out
        self.vocoder_broken = False
        # Its client's player, as loadtest's longest_stall plays it: the perf_counter until which
        # the audio handed out plays (None before the first), and the frames handed out.
        self.playing_until: float | None = None
        self.handed_out = 0
        self.frame_s = vocoder.codec.frame_samples / vocoder.codec.sample_rate
        self.timings: Timings = {"prompt_rows": len(prompt.rows), "prompt_ms": round(prompt.prompt_ms, 1)}

    @property
    def decoding(self) -> bool:
        return self.finish is None

    def since_start_ms(self) -> float:
        return round(self.prompt.prompt_ms + (time.perf_counter() - self.started) * 1000, 1)

    def prefilled(self) -> None:
        self.timings["prefill_ms"] = round((time.perf_counter() - self.started) * 1000, 1)

    def stopped(self) -> str | None:
        """The reason to stop before the next step, if any."""
        if self.vocoder_broken:
            return "error"
        if self.cancelled is not None and self.cancelled():
            return "cancelled"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "deadline"
        return None

    def advance(self, status: list[int], step_s: float, pace_s: float = 0.0) -> str | None:
        """Take one step's status row (finite, main token, codes 0..9) after a step whose decode
        took `step_s` (its timings), `pace_s` the longest the next steps are expected to take
        (early windows); returns a finish reason when the take ends with it."""
        finite, main, *codes = status
        self.steps += 1
        self.step_s += step_s
        self.position += 1
        if not finite:
            self.error = "the model produced non-finite logits; the take was stopped"
            return "error"
        if main == self.eos:
            self.held = False  # a <|semantic:0|> frame right before end of speech is a click: drop it
            return "stop"
        self.codes[:, self.committed + self.held] = codes
        self.committed += self.held
        self.held = main == self.semantic_start
        self.committed += not self.held
        while (window := self.schedule.due(self.committed)) is not None:
            # (decode steps before the first window: more than its frames when frames were held)
            self.timings.setdefault("first_window_steps", self.steps)
            self.submit(window)
        if self.early and (playing := self.playing(time.perf_counter())) is not None \
                and playing.ahead_s < (1 + HAND_OUT_STEPS) * pace_s and (window := self.schedule.cut(self.committed)):
            self.submit(window)
        if self.steps >= self.prompt.sampling.max_new_tokens:
            return "length"
        return None

    def submit(self, window: Window) -> None:
        self.windows.submit(self.codes, window, self.runs_dry(window))

    def runs_dry(self, window: Window) -> float:
        """When its client runs out of the audio before `window` (perf_counter), as loadtest's
        player plays it: the audio handed out and playing, then the windows before it still
        vocoding; now before its first audio."""
        now = time.perf_counter()
        return max(now, self.playing_until or now) + (window.emit - self.handed_out) * self.frame_s

    def playing(self, now: float) -> Playing | None:
        """Where its stream stands against the audio playing at its client (admission.py); None
        before its first audio is out or once it stopped decoding. The windows vocoding count
        as sent; a client that ran out of audio restarts with the next window. With early
        windows its next window can close after the next step whatever the schedule."""
        if self.playing_until is None or not self.decoding:
            return None
        vocoding_s = (self.schedule.emitted - self.handed_out) * self.frame_s
        frames = 1 if self.early else self.schedule.next_end - self.committed
        return Playing(max(0.0, self.playing_until - now) + vocoding_s, frames)

    def close(self, reason: str, error: str | None = None) -> None:
        """End the decoding (any reason): commit a held frame, send the final window."""
        self.finish, self.error = reason, self.error or error
        self.committed += self.held
        self.held = False
        self.timings.setdefault("prefill_ms", round((time.perf_counter() - self.started) * 1000, 1))
        if self.vocoder_broken:
            self.end_stream()
            return
        try:
            self.submit(self.schedule.final(self.committed))
        except Exception as exc:  # noqa: BLE001 - the vocoder failed: report it, the codes stand
            self.vocoder_failed(exc)

    def vocoder_failed(self, exc: Exception) -> None:
        """A window could not be vocoded: the take ends as an error (at the next step if it is
        decoding), its stream closes with an empty last window; the codes stand."""
        self.vocoder_broken = True
        self.error = self.error or f"{type(exc).__name__}: {exc}"
        self.windows.pending.clear()
        if not self.decoding:
            self.finish = "error"
            self.end_stream()

    def end_stream(self) -> None:
        empty = np.zeros((self.codes.shape[0], 0), dtype=np.int64)
        self.windows.pending.append((Window(0, 0, last=True), empty, np.zeros(0, dtype=np.int16), []))

    def ready(self, wait: bool = False, done: bool = True) -> list[AudioWindow | Done]:
        """Windows decoded so far, in order (all of them if `wait` and the take is closed), then
        Done once the take is closed and its last window is out (not with `done=False`: a step
        is still running, slots.py `hand_ready`)."""
        events: list[AudioWindow | Done] = []
        try:
            for window in self.windows.ready(wait and not self.decoding):
                if len(window.pcm) and "first_audio_ms" not in self.timings:
                    self.timings["first_audio_ms"] = self.since_start_ms()
                if window.frames:
                    now = time.perf_counter()
                    self.playing_until = max(now, self.playing_until or now) + window.frames * self.frame_s
                    self.handed_out += window.frames
                events.append(window)
        except Exception as exc:  # noqa: BLE001 - the vocoder failed: report it, the codes stand
            self.vocoder_failed(exc)
            events.extend(self.windows.ready())  # the empty last window of a closed take
        if self.decoding or self.windows.pending or self.done or not done:
            return events
        self.done = True
        self.timings.setdefault("first_audio_ms", None)
        self.timings.update(frames=self.committed, total_ms=self.since_start_ms(),
                            decode_frames_per_s=round(self.steps / self.step_s, 1) if self.step_s else None)
        events.append(Done(finish_reason=self.finish or "error", timings=self.timings,
                           codes=self.codes[:, :self.committed].copy(), error=self.error,
                           cuts=tuple(self.schedule.cuts)))
        return events

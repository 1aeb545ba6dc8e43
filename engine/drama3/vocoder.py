"""The vocoder: every take's due windows, decoded on one worker thread, the most urgent first.

    vocoder = Vocoder(codec, graphs, executor)     # executor: one worker thread, or None (inline)
    future = vocoder.submit(frames, window, state, deadline)  # frames [num_codebooks, >= window.end],
                                                   # on the host; state: the take's StreamState
                                                   # (codec_stream.py); deadline: when its client runs dry
    pcm = future.result()                          # int16 [window.frames * frame_samples]

Design choices:
- One queue for the windows of every take. The worker drains it with `decode_windows`
  (codec_graphs.py: a call a window, each take's windows in its order through its codec
  state): each time a call can launch (at most IN_FLIGHT launched and not yet read) it takes
  the most urgent window queued by then (`order`), across all takes, until the queue is empty
  or DRAIN_WINDOWS are taken, then reads the calls in flight and lets an export use the
  graphs (their lock) before the next drain. A lone take's first window waits at most for
  the IN_FLIGHT calls in flight, never for a batch to fill. Until stop 53 a drain took its
  DRAIN_WINDOWS windows at once and launched them back to back: a first window queued just
  after waited for up to 8 calls (~30-60 ms on an H100) and then its own.
- Urgent first (`order="deadline"`, the default): each window comes with the time its take's
  client runs out of the audio before it (take.py `runs_dry`: now for a first window, seconds
  ahead for a long window of a take well ahead), each call takes the soonest, and the rest
  wait with whatever comes meanwhile. On an H100 each window is a codec call of 3.6-7.7 ms
  whatever its frames, and at 32 to 64 directors a drain held tens of windows (stop 46:
  windows waited p50 87-505 ms to be vocoded): a take's 2-frame second window, due in 46 ms,
  waited behind 64-frame windows of takes with seconds of audio ahead.
  A take's windows keep their order (each is keyed no sooner than the one before it).
- A take's first window goes before every later window, whatever their deadlines: on the
  H200 (stop 48) 64 directors kept the vocoder busy 97% of the time, windows of takes already
  dry were due before a new take's first window (due when it closed), and first audio p95
  was 2,270 ms by deadline against 976 by arrival (which put first windows first). A first
  window is one cheap call (2.6 ms on the H200, one frame without context), so the takes
  playing lose little.
  `order="arrival"`: first windows first, the rest as they came (before stop 46).
- Each window has its own future, set as soon as its codec call's samples are on the host
  (not after every window of the drain: at 64 takes a drain held tens of windows, and a
  take's first window, decoded first, waited for all of them); a take hands out its windows
  in its own order (take.py's `Windows`), so order per take holds whatever order a drain
  decodes in.
- A drain that fails is retried window by window (the windows it took and had not handed
  out), so only the takes whose window fails get the error (take.py ends them); the others'
  windows stand.
- On CUDA a drain's copies and codec calls run on a side stream of the vocoder's own, so
  they overlap the decode steps on the default stream (the seed's vocoder stream)
  instead of queueing behind them; both copies are pinned and non-blocking
  (engine/readback.py). The stream has high priority: when a window's kernels and a step's
  wait for an SM together, the window's go first (a take's first window is decoded while
  the step's backbone half runs, decoder.py; a director hears it that much sooner).
- Without an executor (a bench, a test) `submit` decodes at once, alone: the same graph
  and row count as in a batch (codec_graphs.py), so the same samples.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future

import numpy as np
import torch
from numpy.typing import NDArray

from engine.drama3.codec import Codec
from engine.drama3.codec_graphs import WindowGraphs, decode_windows
from engine.drama3.codec_stream import StreamState
from engine.drama3.pace import Pace
from engine.drama3.stream import Window
from engine.readback import to_device

log = logging.getLogger("retake.engine")

# A take's frames, its window, its codec state, the PCM to come, when it was submitted and when its
# take's client runs out of the audio before it (perf_counter)
Job = tuple[NDArray[np.int64], Window, StreamState, "Future[NDArray[np.int16]]", float, float]
ORDERS = ("deadline", "arrival")
DRAIN_WINDOWS = 8  # the most windows a drain takes before an export may use the graphs

_side_streams: dict[torch.device, torch.cuda.Stream] = {}


def vocode(codec: Codec, graphs: WindowGraphs | None,
           windows: Iterable[tuple[NDArray[np.int64], Window, StreamState]],
           ready: Callable[[int, NDArray[np.int16]], None] | None = None,
           timed: Callable[[float], None] | None = None) -> list[NDArray[np.int16]]:
    """Each window's PCM16 from its take's frames [num_codebooks, >= end] on the host and its
    take's codec state, in order, each taken from `windows` as its call can launch;
    `ready(index, pcm)` as each is decoded, `timed(ms)` each graph call's time on the GPU
    (codec_graphs.py `decode_windows`)."""
    with torch.inference_mode():  # on the worker thread too: the graphs' buffers may be inference tensors
        if codec.device.type != "cuda":
            return decode_windows(codec, ((torch.from_numpy(frames), window, state)
                                          for frames, window, state in windows), graphs, ready, timed)
        stream = _side_streams.get(codec.device)
        if stream is None:  # (setdefault would make a stream on every call to keep the first)
            # High priority: its kernels go before the decode step's when both wait for an SM.
            stream = _side_streams[codec.device] = torch.cuda.Stream(device=codec.device, priority=-1)
        with torch.cuda.stream(stream):
            on_device = ((to_device(frames, codec.device), window, state) for frames, window, state in windows)
            return decode_windows(codec, on_device, graphs, ready, timed)


class Vocoder:
    """Windows of every take, vocoded on one worker thread (or inline), the most urgent first."""

    def __init__(self, codec: Codec, graphs: WindowGraphs | None, executor: Executor | None,
                 pace: Pace | None = None, order: str = "deadline") -> None:
        if order not in ORDERS:
            raise ValueError(f"the vocoder's order is one of {', '.join(ORDERS)}; got {order!r}")
        self.codec, self.graphs, self.executor, self.order = codec, graphs, executor, order
        self.pace = pace  # each window's time from submitted to PCM and whether late, each drain's (pace.py)
        self.lock = threading.Lock()
        self.queue: list[Job] = []  # submitted, not yet taken by a drain
        self.draining = False  # a drain is scheduled or running on the executor
        self.drains = 0  # drains run (an inline window is one), plus a failed drain's retries
        self.windows = 0  # windows decoded (a failed drain's counted again in its retries)
        self.decoded = 0  # futures set so far: the decode loop hands windows out when it moves (slots.py)

    def submit(self, frames: NDArray[np.int64], window: Window, state: StreamState,
               deadline: float | None = None) -> Future[NDArray[np.int16]]:
        """The future PCM16 of `window` of a take whose frames so far are `frames` (not written
        to afterwards: the caller hands over a copy) and whose codec state is `state` (a take
        submits its windows in order); `deadline`: when its client runs out of the audio before
        it (perf_counter; None: now)."""
        future: Future[NDArray[np.int16]] = Future()
        submitted = time.perf_counter()
        job = (frames, window, state, future, submitted, submitted if deadline is None else deadline)
        if self.executor is None:
            self.decode([job])
            return future
        with self.lock:
            self.queue.append(job)
            if self.draining:
                return future
            self.draining = True
        try:
            self.executor.submit(self.drain)
        except Exception:
            with self.lock:  # (the executor is shut down) nothing will drain: the caller reports it
                self.draining = False
                self.queue.remove(job)
            raise
        return future

    def due(self, within_s: float) -> bool:
        """A queued window's client runs out of audio within `within_s` (a first window's
        deadline is its submission: always due). The slot table holds warms back meanwhile."""
        horizon = time.perf_counter() + within_s
        with self.lock:
            return any(job[5] <= horizon for job in self.queue)

    def drain(self) -> None:
        """Decode the queued windows, a drain at a time until the queue is empty (on the worker thread)."""
        while True:
            self.decode(self.taken())
            with self.lock:
                if not self.queue:
                    self.draining = False
                    return

    def taken(self) -> Iterator[Job]:
        """A drain's windows, each taken off the queue as its call can launch (`next_job`)."""
        for _ in range(DRAIN_WINDOWS):
            with self.lock:
                job = self.next_job()
            if job is None:
                return
            yield job

    def next_job(self) -> Job | None:
        """The most urgent queued window (`order`), taken off the queue (with the lock held)."""
        queue = self.queue
        if not queue:
            return None
        if self.order == "arrival":  # first windows first, the rest as they came
            number = min(range(len(queue)), key=lambda number: (queue[number][1].emit != 0, number))
        else:
            keys: list[tuple[bool, float, int]] = []
            latest: dict[int, float] = {}  # a take's windows keep their order: none keyed sooner than the one before
            for number, (_, window, state, _, _, deadline) in enumerate(queue):
                latest[id(state)] = max(deadline, latest.get(id(state), deadline))
                keys.append((window.emit != 0, latest[id(state)], number))  # first windows first (design choices)
            number = min(keys)[2]
        return queue.pop(number)

    def decode(self, jobs: Iterable[Job]) -> None:
        """Decode `jobs` (taken lazily, in order), each window's future set as its samples exist."""
        self.drains += 1
        taken: list[Job] = []
        started, cpu = time.perf_counter(), time.thread_time()

        def windows() -> Iterator[tuple[NDArray[np.int64], Window, StreamState]]:
            for job in jobs:
                taken.append(job)
                self.windows += 1
                yield job[0], job[1], job[2]

        def ready(index: int, pcm: NDArray[np.int16]) -> None:  # each window handed out as it is decoded
            _, window, _, future, submitted, deadline = taken[index]
            future.set_result(pcm)
            self.decoded += 1  # (only this thread writes it; a reader sees it late at worst)
            if self.pace is not None:  # (a first window is neither: its wait is first audio's)
                now, later = time.perf_counter(), window.emit > 0
                dry = later and deadline <= submitted  # its client had run dry when it closed: the decode's gap
                self.pace.window(now - submitted, late=later and not dry and now > deadline, dry=dry)

        try:
            vocode(self.codec, self.graphs, windows(), ready, None if self.pace is None else self.pace.call)
            if self.pace is not None:
                self.pace.drain(time.perf_counter() - started, time.thread_time() - cpu)
        except Exception as exc:  # find the windows that fail; the others stand
            left = [job for job in taken if not job[3].done()]  # (those decoded before the failure are out)
            if not left:  # (nothing taken: no take to tell)
                log.exception("the vocoder failed before a window")
            elif len(left) == 1:
                left[0][3].set_exception(exc)
            else:
                for job in left:
                    self.decode([job])

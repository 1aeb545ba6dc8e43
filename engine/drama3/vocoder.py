"""The vocoder: every take's due windows, decoded on one worker thread, the most urgent first.

    vocoder = Vocoder(codec, graphs, executor)     # executor: one worker thread, or None (inline)
    future = vocoder.submit(frames, window, state, deadline)  # frames [num_codebooks, >= window.end],
                                                   # on the host; state: the take's StreamState
                                                   # (codec_stream.py); deadline: when its client runs dry
    pcm = future.result()                          # int16 [window.frames * frame_samples]

Design choices:
- One queue for the windows of every take. The worker drains it: it takes the most urgent
  windows queued by then (`order`), across all takes, and decodes them with `decode_windows`
  (codec_graphs.py: each take's windows in its order through its codec state, in the order
  given). Windows that arrive during a drain go to the next one, which starts at once: a
  lone take's first window waits at most for the drain in progress, never for a batch to fill.
- Urgent first (`order="deadline"`, the default): each window comes with the time its take's
  client runs out of the audio before it (take.py `runs_dry`: now for a first window, seconds
  ahead for a long window of a take well ahead), a drain decodes the DRAIN_WINDOWS soonest,
  and the rest wait for the next drain with whatever came meanwhile. On an H100 each window is
  a codec call of 3.6-7.7 ms whatever its frames, and at 32 to 64 directors a drain held tens
  of windows (stop 46: windows waited p50 87-505 ms to be vocoded): a take's 2-frame second
  window, due in 46 ms, waited behind 64-frame windows of takes with seconds of audio ahead.
  A take's windows keep their order (each is keyed no sooner than the one before it).
- A take's first window goes before every later window, whatever their deadlines: on the
  H200 (stop 48) 64 directors kept the vocoder busy 97% of the time, windows of takes already
  dry were due before a new take's first window (due when it closed), and first audio p95
  was 2,270 ms by deadline against 976 by arrival (which put first windows first). A first
  window is one cheap call (2.6 ms on the H200, one frame without context), so the takes
  playing lose little.
  `order="arrival"`: first windows first, the rest as they came, every queued window in one
  drain (before stop 46).
- Joined windows (`join`, `retake serve --vocoder-join on`; off by default until the H200
  measures it): a drain that takes a take's window takes that take's windows queued after it
  too and decodes them as one window, up to JOIN_FRAMES frames, in one call. A call costs
  about the same for 2 frames as for 32 (stop 48's H200: 3.8 ms for 2 frames after 320, 6.2
  for 10, 7.1 for 64), and at 64 directors the vocoder was busy 92-97% with ~114 windows a
  second, most of them the schedule's short ramp (1, 2, 4, 10, 20, 32): a take's windows queue
  together exactly when the vocoder is behind. Each window still gets its own samples (the
  call's, split by frames); never a first window (first audio's call stays short). The take's
  state lists where windows joined (Done.joined): the joined window runs in the graph of its
  own frame count, so the export (render_take with them) replays the stream sample for sample;
  without them it differs by rounding only.
- Each window has its own future, set as soon as its codec call's samples are on the host
  (not after every window of the drain: at 64 takes a drain held tens of windows, and a
  take's first window, decoded first, waited for all of them); a drain's calls are launched
  back to back and read in launch order (codec_graphs.py `decode_windows`), so the GPU never
  waits for this thread between them; a take hands out its windows in its own order
  (take.py's `Windows`), so order per take holds whatever order a drain decodes in.
- A drain that fails is retried window by window, so only the takes whose window fails
  get the error (take.py ends them); the others' windows stand.
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

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future

import numpy as np
import torch
from numpy.typing import NDArray

from engine.drama3.codec import Codec
from engine.drama3.codec_graphs import WindowGraphs, decode_windows
from engine.drama3.codec_stream import StreamState
from engine.drama3.pace import Pace
from engine.drama3.stream import STREAM_FOLLOWUP_STRIDE, Window
from engine.readback import to_device

# A take's frames, its window, its codec state, the PCM to come, when it was submitted and when its
# take's client runs out of the audio before it (perf_counter)
Job = tuple[NDArray[np.int64], Window, StreamState, "Future[NDArray[np.int16]]", float, float]
ORDERS = ("deadline", "arrival")
DRAIN_WINDOWS = 8  # the most windows a drain takes, urgent first (~30-60 ms of codec calls on an H100)
JOIN_FRAMES = STREAM_FOLLOWUP_STRIDE  # the most frames a joined window has (the longest window graph's)

_side_streams: dict[torch.device, torch.cuda.Stream] = {}


def vocode(codec: Codec, graphs: WindowGraphs | None,
           windows: list[tuple[NDArray[np.int64], Window, StreamState]],
           ready: Callable[[int, NDArray[np.int16]], None] | None = None,
           timed: Callable[[float], None] | None = None) -> list[NDArray[np.int16]]:
    """Each window's PCM16 from its take's frames [num_codebooks, >= end] on the host and its
    take's codec state, in order; `ready(index, pcm)` as each is decoded, `timed(ms)` each
    graph call's time on the GPU (codec_graphs.py `decode_windows`)."""
    with torch.inference_mode():  # on the worker thread too: the graphs' buffers may be inference tensors
        if codec.device.type != "cuda":
            return decode_windows(codec, [(torch.from_numpy(frames), window, state)
                                          for frames, window, state in windows], graphs, ready, timed)
        stream = _side_streams.get(codec.device)
        if stream is None:  # (setdefault would make a stream on every call to keep the first)
            # High priority: its kernels go before the decode step's when both wait for an SM.
            stream = _side_streams[codec.device] = torch.cuda.Stream(device=codec.device, priority=-1)
        with torch.cuda.stream(stream):
            on_device = [(to_device(frames, codec.device), window, state) for frames, window, state in windows]
            return decode_windows(codec, on_device, graphs, ready, timed)


class Vocoder:
    """Windows of every take, vocoded together on one worker thread (or inline)."""

    def __init__(self, codec: Codec, graphs: WindowGraphs | None, executor: Executor | None,
                 pace: Pace | None = None, order: str = "deadline", join: bool = False) -> None:
        if order not in ORDERS:
            raise ValueError(f"the vocoder's order is one of {', '.join(ORDERS)}; got {order!r}")
        self.codec, self.graphs, self.executor, self.order = codec, graphs, executor, order
        self.join = join  # a take's queued windows decode in one call (`joinable`)
        self.pace = pace  # each window's time from submitted to PCM and whether late, each drain's (pace.py)
        self.lock = threading.Lock()
        self.queue: list[Job] = []  # submitted, not yet taken by a drain
        self.draining = False  # a drain is scheduled or running on the executor
        self.calls = 0  # decode calls: one per drain (or inline window), plus a failed drain's retries
        self.windows = 0  # windows decoded (a failed drain's counted again in its retries)

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
            self.decode([[job]])
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

    def drain(self) -> None:
        """Decode every queued window, again until the queue is empty (on the worker thread)."""
        while True:
            with self.lock:
                jobs = self.next_jobs()
                if not jobs:
                    self.draining = False
                    return
            self.decode(jobs)

    def next_jobs(self) -> list[list[Job]]:
        """The next drain's calls, taken off the queue (`order`; with the lock held): each a
        window, or a take's windows joined (`join`)."""
        queue = self.queue
        if self.order == "arrival":
            chosen = sorted(range(len(queue)), key=lambda number: queue[number][1].emit != 0)  # first windows first
        else:
            keys: list[tuple[bool, float, int]] = []
            latest: dict[int, float] = {}  # a take's windows keep their order: none keyed sooner than the one before
            for number, (_, window, state, _, _, deadline) in enumerate(queue):
                latest[id(state)] = max(deadline, latest.get(id(state), deadline))
                keys.append((window.emit != 0, latest[id(state)], number))  # first windows first (design choices)
            chosen = [number for *_, number in sorted(keys)[:DRAIN_WINDOWS]]
        taken: set[int] = set()
        calls: list[list[Job]] = []
        for number in chosen:
            if number in taken:
                continue
            taken.add(number)
            calls.append([queue[number]])
            for other in range(number + 1, len(queue)) if self.join else ():  # its take's next windows, queued in order
                if queue[other][2] is queue[number][2]:
                    if not self.joinable(calls[-1], queue[other][1]):
                        break
                    taken.add(other)
                    calls[-1].append(queue[other])
        self.queue = [job for number, job in enumerate(queue) if number not in taken]
        return calls

    def joinable(self, call: list[Job], window: Window) -> bool:
        """Whether `window` decodes in one call with a take's windows `call` (the window before it
        last): not after a first window (first audio's call stays short), at most JOIN_FRAMES
        frames together, in a graph where the vocoder has graphs."""
        joined = Window(call[0][1].emit, window.end, window.last)
        return call[0][1].emit > 0 and joined.frames <= JOIN_FRAMES and (
            self.graphs is None or self.graphs.key_for(joined) is not None)

    def decode(self, calls: list[list[Job]]) -> None:
        jobs = [job for call in calls for job in call]
        self.calls += 1
        self.windows += len(jobs)
        started, cpu = time.perf_counter(), time.thread_time()
        samples = self.codec.frame_samples

        def ready(index: int, pcm: NDArray[np.int16]) -> None:  # each call's windows handed out as it is decoded
            call = calls[index]
            call[0][2].joined.extend(window.end for _, window, *_ in call[:-1])  # before a Done reads them
            for _, window, _, future, submitted, deadline in call:
                future.set_result(pcm[:window.frames * samples])
                pcm = pcm[window.frames * samples:]
                if self.pace is not None:  # (a first window is neither: its wait is first audio's)
                    now, later = time.perf_counter(), window.emit > 0
                    dry = later and deadline <= submitted  # its client had run dry when it closed: the decode's gap
                    self.pace.window(now - submitted, late=later and not dry and now > deadline, dry=dry,
                                     joined=window is not call[-1][1])

        try:
            vocode(self.codec, self.graphs, [(call[-1][0], Window(call[0][1].emit, call[-1][1].end, call[-1][1].last),
                                              call[0][2]) for call in calls],
                   ready, None if self.pace is None else self.pace.call)
            if self.pace is not None:
                self.pace.drain(time.perf_counter() - started, time.thread_time() - cpu)
        except Exception as exc:  # noqa: BLE001 - find the windows that fail; the others stand
            left = [job for job in jobs if not job[3].done()]  # (those decoded before the failure are out)
            if len(left) == 1:
                left[0][3].set_exception(exc)
                return
            for job in left:
                self.decode([[job]])

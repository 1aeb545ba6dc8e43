"""The engine loop: one thread owns the engine and runs jobs from a bounded queue, one at a time.

Design choices:
- The engine is loaded, warmed up and used by this thread only (CUDA context, graphs and
  caches live here); the event loop never touches it. Sessions and HTTP handlers submit
  jobs; results go back with `loop.call_soon_threadsafe`, never by touching asyncio objects
  from this thread.
- A job is a take (`TakeJob`: prefill and decode, windows streamed back as they exist) or a
  short call (`CallJob`: encode a reference, vocode a take for export). Jobs run in arrival
  order; `max_queue` may wait, past that `submit` raises `Busy`. (Later: several takes in one
  batched step, picked earliest-deadline-first; the queue and the job interface stay.)
- A queued job can be withdrawn (cancel, supersede, deadline, disconnect) by the event loop;
  a running take polls its `cancelled` flag every engine step.
- Nothing a job does can stop the loop: a take's failure is reported to that take's sink as
  `finish_reason="error"`; a call's failure is raised from its future.
- The silence guard lives here because it decides whether the engine runs the take again:
  when the first `silence_seconds` of an attempt's audio have a peak at or below
  `silence_level`, the attempt is stopped and the take runs again with seed + 1.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

import numpy as np

from backend.protocol import FinishReason
from engine import AudioWindow, Done, Drama3Engine, Prompt, RequestError, Sampling

log = logging.getLogger("retake.loop")
T = TypeVar("T")


class Busy(Exception):
    """The queue is full."""

    def __init__(self, waiting: int, retry_after_ms: int) -> None:
        super().__init__(f"the engine queue is full ({waiting} waiting); retry in {retry_after_ms / 1000:g} s")
        self.retry_after_ms = retry_after_ms


class Job:
    """Something the engine thread runs; `cancel` may be called from any thread."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.submitted = time.monotonic()

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self, engine: Drama3Engine) -> None:
        raise NotImplementedError

    def withdrawn(self) -> None:
        """Called (on the event loop) when the job left the queue without running."""


class CallJob(Job, Generic[T]):
    """Run `fn(engine)` on the engine thread; its result or exception lands in `future`."""

    def __init__(self, fn: Callable[[Drama3Engine], T], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()

    def run(self, engine: Drama3Engine) -> None:
        try:
            result = self.fn(engine)
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
            self.loop.call_soon_threadsafe(_set_exception, self.future, error)
        else:
            self.loop.call_soon_threadsafe(_set_result, self.future, result)

    def withdrawn(self) -> None:
        self.future.cancel()


def _set_result(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class TakeSink(Protocol):
    """Receives a take's events on the event loop, in this order:
    started, history (first attempt only), window..., [retry, started, window...], done."""

    def started(self, attempt: int, sampling: Sampling) -> None: ...

    def history(self, used: int) -> None: ...

    def window(self, attempt: int, window: AudioWindow) -> None: ...

    def retry(self, attempt: int, message: str) -> None: ...

    def done(self, outcome: TakeOutcome) -> None: ...


@dataclass(frozen=True)
class TakeOutcome:
    finish_reason: FinishReason
    timings: dict[str, float | int | None]
    codes: np.ndarray | None  # int64 [codebooks, frames] of the last attempt, None if it never ran
    samples: int
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class SilenceGuard:
    seconds: float = 2.0
    level: int = 64  # int16 peak at or below which audio counts as silent (about -54 dBFS)
    retries: int = 2


PromptBuilder = Callable[[Drama3Engine, Sampling], Prompt]


class TakeJob(Job):
    """One take: build its prompt, generate, stream windows to `sink`; retried on silence."""

    def __init__(self, build_prompt: PromptBuilder, sampling: Sampling, sink: TakeSink,
                 loop: asyncio.AbstractEventLoop, deadline: float | None, guard: SilenceGuard | None) -> None:
        super().__init__()
        self.build_prompt = build_prompt
        self.sampling = sampling
        self.sink = sink
        self.loop = loop
        self.deadline = deadline  # time.monotonic() value
        self.guard = guard
        self.error: str | None = None  # set with cancel() when the event loop stops a take for a reason

    def fail(self, message: str) -> None:
        """Stop the take and end it as an error (e.g. the client does not read its audio)."""
        self.error = message
        self.cancel()

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed (the server stopped): nobody listens any more
            self.cancel()

    def _finish(self, outcome: TakeOutcome) -> None:
        self._post(self.sink.done, outcome)

    def run(self, engine: Drama3Engine) -> None:
        queue_ms = round((time.monotonic() - self.submitted) * 1000)
        if self.cancelled.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline):
            self._finish(TakeOutcome("cancelled" if self.cancelled.is_set() else "deadline",
                                     {"queue_ms": queue_ms}, None, 0, 0, self.error))
            return
        attempt, sampling = 1, self.sampling
        while True:
            stop_attempt = threading.Event()
            try:
                prompt = self.build_prompt(engine, sampling)
            except RequestError as error:
                self._finish(TakeOutcome("error", {"queue_ms": queue_ms}, None, 0, attempt, str(error)))
                return
            except Exception as error:  # noqa: BLE001 - one take's failure never stops the loop
                log.error("take prompt failed:\n%s", traceback.format_exc())
                self._finish(TakeOutcome("error", {"queue_ms": queue_ms}, None, 0, attempt,
                                         f"{type(error).__name__}: {error}"))
                return
            self._post(self.sink.started, attempt, prompt.sampling)
            if attempt == 1:
                self._post(self.sink.history, prompt.history_used)
            retry = self.guard is not None and attempt <= self.guard.retries
            silent_samples, peak, samples = 0, 0, 0
            done: Done | None = None

            def stopped(stop: threading.Event = stop_attempt) -> bool:
                return self.cancelled.is_set() or stop.is_set()

            try:
                for event in engine.generate(prompt, deadline=self.deadline, cancelled=stopped):
                    if isinstance(event, AudioWindow):
                        samples += len(event.pcm)
                        self._post(self.sink.window, attempt, event)
                        if retry and self.guard is not None and not stop_attempt.is_set():
                            peak = max(peak, int(np.abs(event.pcm.astype(np.int32)).max(initial=0)))
                            silent_samples = samples if peak <= self.guard.level else -1
                            if silent_samples >= self.guard.seconds * engine.sample_rate:
                                stop_attempt.set()
                    elif isinstance(event, Done):
                        done = event
            except Exception as error:  # noqa: BLE001
                log.error("take failed:\n%s", traceback.format_exc())
                self._finish(TakeOutcome("error", {"queue_ms": queue_ms}, None, samples, attempt,
                                         f"{type(error).__name__}: {error}"))
                return
            assert done is not None, "engine.generate ended without Done"
            if stop_attempt.is_set() and not self.cancelled.is_set() and done.finish_reason == "cancelled":
                seed = (sampling.seed or 0) + 1
                message = (f"the take was silent for {silent_samples / engine.sample_rate:.1f} s; retrying with "
                           f"seed {seed} (attempt {attempt + 1} of {self.guard.retries + 1 if self.guard else 1})")
                log.info(message)
                attempt += 1
                sampling = dataclasses.replace(sampling, seed=seed)
                self._post(self.sink.retry, attempt, message)
                continue
            codes = done.codes.numpy() if done.codes is not None else None
            error_text = done.error if done.finish_reason == "error" else None
            reason: FinishReason
            if self.error is not None:
                error_text, reason = self.error, "error"
            else:
                reason = cast(FinishReason, done.finish_reason)
            self._finish(TakeOutcome(reason, {"queue_ms": queue_ms, **done.timings}, codes, samples, attempt,
                                     error_text))
            return


class EngineLoop:
    """The thread that owns the engine, and the queue in front of it."""

    def __init__(self, load: Callable[[], Drama3Engine], max_queue: int) -> None:
        self.load = load
        self.max_queue = max_queue
        self.engine: Drama3Engine | None = None
        self.warm_up: dict[str, float | None] = {}
        self._queue: collections.deque[Job] = collections.deque()
        self._condition = threading.Condition()
        self._stopping = False
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="engine-loop", daemon=True)
        self.running: Job | None = None
        self.last_take_s = 2.0  # duration of the last take; the busy retry hint

    def start(self) -> Drama3Engine:
        """Start the thread; wait until the engine is loaded and warm. Raises what loading raised."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        assert self.engine is not None
        return self.engine

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            for job in self._queue:
                job.cancel()
            if self.running is not None:
                self.running.cancel()
            self._condition.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    @property
    def depth(self) -> int:
        """Jobs waiting, not counting the one running."""
        return len(self._queue)

    def submit(self, job: Job) -> int:
        """Queue a job; returns how many jobs are ahead of it. Raises Busy when the queue is full."""
        with self._condition:
            if self._stopping:
                raise Busy(len(self._queue), 1000)
            if len(self._queue) >= self.max_queue:
                retry_ms = round(1000 * max(0.5, self.last_take_s) * max(1, len(self._queue)) / 2)
                raise Busy(len(self._queue), retry_ms)
            ahead = len(self._queue) + (self.running is not None)
            self._queue.append(job)
            self._condition.notify()
            return ahead

    def withdraw(self, job: Job) -> bool:
        """Take a job out of the queue if it has not started; True if it was withdrawn."""
        with self._condition:
            try:
                self._queue.remove(job)
            except ValueError:
                return False
        job.withdrawn()
        return True

    def _main(self) -> None:
        try:
            self.engine = self.load()
            self.warm_up = dict(self.engine.warm_up())
        except BaseException as error:  # noqa: BLE001 - re-raised by start() in the caller's thread
            self._load_error = error
            self._ready.set()
            return
        self._ready.set()
        engine = self.engine
        while True:
            with self._condition:
                while not self._queue and not self._stopping:
                    self._condition.wait()
                if self._stopping:
                    return
                job = self.running = self._queue.popleft()
            started = time.monotonic()
            try:
                job.run(engine)
            except BaseException:  # noqa: BLE001 - jobs report their own failures; this is a last resort
                log.error("engine job crashed:\n%s", traceback.format_exc())
            finally:
                if isinstance(job, TakeJob):
                    self.last_take_s = time.monotonic() - started
                with self._condition:
                    self.running = None

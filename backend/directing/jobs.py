"""What the engine loop runs: short calls, and takes driven step by step (backend/directing/loop.py).

Design choices:
- A `CallJob` is one function of the engine (encode a reference, vocode a take for an
  export), run between two decode steps; its result or exception lands in an asyncio future.
- A `TakeJob` is one take with its attempts. The loop calls `begin` when a slot is free
  (build the prompt, start the engine take: prefill) and `handle` with the take's events
  after each step. Events go to the take's sink on the event loop with
  `loop.call_soon_threadsafe`, never by touching asyncio objects from the engine thread.
- A job's `cancelled` flag may be set from any thread; the engine polls it before every
  step, so a running take stops at the next step.
- The silence guard lives here because it decides whether the engine runs the take again:
  when the first `silence_seconds` of an attempt's audio have a peak at or below
  `silence_level`, the attempt is stopped and the take runs again with seed + 1 (the
  loop gives it the next free slot).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar, cast

import numpy as np

from backend.directing.protocol import FinishReason
from backend.engine_thread import post
from engine import AudioWindow, Done, Drama3Engine, Prompt, RequestError, Sampling, Take

log = logging.getLogger("retake.loop")
T = TypeVar("T")


class Job:
    """Something the engine thread runs; `cancel` may be called from any thread."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.submitted = time.monotonic()

    def cancel(self) -> None:
        self.cancelled.set()

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
            post(self.loop, _set_exception, self.future, error)
        else:
            post(self.loop, _set_result, self.future, result)

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
Progress = Literal["running", "retry", "done"]


class TakeJob(Job):
    """One take: build its prompt, start it in a slot, stream windows to `sink`; retried on silence."""

    def __init__(self, build_prompt: PromptBuilder, sampling: Sampling, sink: TakeSink,
                 loop: asyncio.AbstractEventLoop, deadline: float | None, guard: SilenceGuard | None,
                 chars: int = 0) -> None:
        super().__init__()
        self.chars = chars  # the text's length, for the queue's estimate of the take's (queue_wait.py); 0: unknown
        self.build_prompt = build_prompt
        self.sampling = sampling
        self.sink = sink
        self.loop = loop
        self.deadline = deadline  # time.monotonic() value
        self.guard = guard
        self.error: str | None = None  # set with cancel() when the event loop stops a take for a reason
        self.take: Take | None = None  # the engine's take of the current attempt
        self.attempt = 0
        self.queue_ms = 0
        self.began = 0.0  # time.monotonic() of the first attempt's start
        self.stop_attempt = threading.Event()  # the silence guard stops this attempt
        self.samples, self.peak, self.silent_samples = 0, 0, 0
        self.ended: Done | None = None  # the engine's Done of the last attempt, once the take ended

    @property
    def urgency(self) -> tuple[float, float]:
        """Earliest deadline first; without one, after every deadline, in arrival order."""
        return (self.deadline if self.deadline is not None else float("inf"), self.submitted)

    def fail(self, message: str) -> None:
        """Stop the take and end it as an error (e.g. the client does not read its audio)."""
        self.error = message
        self.cancel()

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        if not post(self.loop, fn, *args):  # the server stopped: nobody listens any more
            self.cancel()

    def finish(self, reason: FinishReason, error: str | None = None,
               timings: dict[str, float | int | None] | None = None, codes: np.ndarray | None = None) -> None:
        if reason == "error":  # the operator sees what the director saw (a refused request is theirs to fix)
            log.warning("a take ended with an error after %d frames: %s", 0 if codes is None else codes.shape[-1],
                        error)
        self._post(self.sink.done, TakeOutcome(reason, {"queue_ms": self.queue_ms, **(timings or {})}, codes,
                                               self.samples, self.attempt, error))

    def begin(self, engine: Drama3Engine) -> bool:
        """Start the next attempt in a free slot of `engine`; False if the job ended instead."""
        if self.attempt == 0:
            self.began = time.monotonic()
            self.queue_ms = round((self.began - self.submitted) * 1000)
        if self.cancelled.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline):
            self.finish("cancelled" if self.cancelled.is_set() else "deadline", self.error)
            return False
        self.attempt += 1
        try:
            prompt = self.build_prompt(engine, self.sampling)
        except RequestError as error:
            self.finish("error", str(error))
            return False
        except Exception as error:  # noqa: BLE001 - one take's failure never stops the loop
            log.error("take prompt failed:\n%s", traceback.format_exc())
            self.finish("error", f"{type(error).__name__}: {error}")
            return False
        self._post(self.sink.started, self.attempt, prompt.sampling)
        if self.attempt == 1:
            self._post(self.sink.history, prompt.history_used)
        self.stop_attempt = stop = threading.Event()
        self.samples, self.peak, self.silent_samples = 0, 0, 0
        self.take = engine.start(prompt, deadline=self.deadline,
                                 cancelled=lambda: self.cancelled.is_set() or stop.is_set())
        return True

    def handle(self, engine: Drama3Engine, events: list[AudioWindow | Done]) -> Progress:
        """The current attempt's new events: windows go to the sink; at Done the take ends or
        (silence guard) asks for another attempt."""
        guard = self.guard
        watch = guard is not None and self.attempt <= guard.retries
        for event in events:
            if isinstance(event, AudioWindow):
                self.samples += len(event.pcm)
                self._post(self.sink.window, self.attempt, event)
                if watch and guard is not None and not self.stop_attempt.is_set():
                    self.peak = max(self.peak, int(np.abs(event.pcm.astype(np.int32)).max(initial=0)))
                    self.silent_samples = self.samples if self.peak <= guard.level else -1
                    if self.silent_samples >= guard.seconds * engine.sample_rate:
                        self.stop_attempt.set()
                continue
            self.take = None
            if self.stop_attempt.is_set() and not self.cancelled.is_set() and event.finish_reason == "cancelled":
                seed = (self.sampling.seed or 0) + 1
                message = (f"the take was silent for {self.silent_samples / engine.sample_rate:.1f} s; retrying "
                           f"with seed {seed} (attempt {self.attempt + 1} of "
                           f"{guard.retries + 1 if guard else 1})")
                log.info(message)
                self.sampling = dataclasses.replace(self.sampling, seed=seed)
                self._post(self.sink.retry, self.attempt + 1, message)
                return "retry"
            self.ended = event
            codes = event.codes
            # The engine's Done says one of the FinishReason words (engine/drama3/take.py).
            reason = "error" if self.error is not None else cast(FinishReason, event.finish_reason)
            error_text = self.error if self.error is not None else event.error if reason == "error" else None
            self.finish(reason, error_text, event.timings, codes)
            return "done"
        return "running"

"""The engine loop: one thread owns the engine, admits takes into its decode slots earliest
deadline first, and runs one batched step per turn, with short calls between steps.

    loop = EngineLoop(load, max_queue); loop.start()      # loads and warms the engine
    loop.submit(TakeJob(...) | CallJob(...))              # from the event loop; QueueFull when full
    loop.check_room(max_queue)                            # QueueFull now if a job would not fit
    loop.withdraw(job)                                    # a job still waiting leaves the queue

Design choices:
- The engine is loaded, warmed up and used by this thread only (CUDA context, graphs and
  caches live here; backend/engine_thread.py); the event loop never touches it. Sessions
  and HTTP handlers submit jobs (backend/directing/jobs.py); results go back with
  `loop.call_soon_threadsafe`.
- One turn of the loop: run at most one waiting call (encode a reference, vocode an
  export) so calls never wait behind whole takes, nor stall the takes for long; start the
  most urgent waiting takes in every free slot (earliest deadline first, then arrival; a
  start only lays out the prompt: the engine's steps prefill it a few chunks at a time,
  so the takes already decoding lose little time per step); then one batched engine step
  for every take in flight, whose events go to their jobs.
- Waiting jobs are bounded by `max_queue`; past that `submit` (and `check_room`, which a
  session asks before it stores a take) raises `QueueFull`, with a retry hint estimated
  from what is ahead (queue_wait.py: the takes in the slots and waiting, their expected
  lengths, the measured frame rate), and how many seconds of takes that is. A job still waiting can be
  withdrawn (cancel, supersede, deadline, disconnect) by the event loop; a take in a slot
  polls its `cancelled` flag every step and frees its slot at the next one.
- A take that the silence guard stops goes back to the waiting set (not counted against
  the queue bound) and takes the next free slot in deadline order.
- Nothing a job does can stop the loop or another take: a take's failure ends that take
  (`finish_reason="error"`); a call's failure is raised from its future.
- Every `REPORT_S` (10 s) while takes run, the engine's pace goes to the log in a line
  (engine/drama3/pace.py: steps, prefill beside them, prompts held for playback, windows'
  time to audio), so a slow load says why in the server's log.
- Warms (`warm(key, build)`): a session asks for the prompt of the line its director most
  likely takes next (after a keep, a voice or cast change, the line written, an open:
  directing/warming.py) to be prefilled into the prefix cache (Drama3Engine.warm), so that
  take's first audio pays for its line's rows only, or for none when the script held the
  line's text. A warm is the lowest priority there is: one per session (a newer one
  replaces it), started only in a free slot with no take waiting, cancelled when a take
  waits for its slot, and never counted in the queue.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from backend.directing.jobs import CallJob, Job, TakeJob
from backend.directing.queue_wait import SOON_S, QueueWait, queue_wait
from backend.engine_thread import EngineThread
from engine import AudioWindow, Done, Drama3Engine, Prompt, RequestError, Take
from engine.drama3.pace import REPORT_S


class Warm(NamedTuple):
    """What a warm prefills: `prompt`, with its line's rows when `line` (the script holds the
    line's text, so the take will say it), else up to the end of its history."""

    prompt: Prompt
    line: bool


WarmBuilder = Callable[[Drama3Engine], Warm]  # a warm, built on the engine thread

log = logging.getLogger("retake.loop")


class QueueFull(Exception):
    """The engine queue holds `max_queue` waiting jobs (or the server is stopping)."""

    def __init__(self, waiting: int, retry_after_ms: int, ahead_s: float | None = None) -> None:
        ahead = "" if ahead_s is None else f", about {ahead_s:.1f} s of takes ahead"
        super().__init__(f"the engine queue is full ({waiting} waiting{ahead}); retry in {retry_after_ms / 1000:g} s")
        self.retry_after_ms = retry_after_ms
        self.ahead_s = ahead_s

    @property
    def retry_after_s(self) -> int:
        """For an HTTP Retry-After header: whole seconds, at least 1."""
        return max(1, round(self.retry_after_ms / 1000))


class EngineLoop(EngineThread[Drama3Engine]):
    """The thread that owns the Drama 3 engine, and the queue in front of it."""

    def __init__(self, load: Callable[[], Drama3Engine], max_queue: int) -> None:
        super().__init__(load, "engine-loop")
        self.max_queue = max_queue
        self.slots = 1  # the engine's, once loaded
        self.warm_up: dict[str, float | int | str | list[str] | None] = {}
        self._queue: collections.deque[Job] = collections.deque()  # waiting, bounded by max_queue
        self._retries: list[TakeJob] = []  # between attempts, waiting for a slot
        self._running: dict[Take, TakeJob] = {}  # the engine's takes in flight and their jobs
        self._starting: TakeJob | None = None  # out of the queue, being started (prompt, prefill)
        self._failed: dict[Take, Exception] = {}  # jobs whose windows failed mid-step (`_hand_early`)
        self.wait = QueueWait()  # the rates of the busy retry hint, measured as takes end
        self.frame_samples = 2048  # the engine's, once loaded
        self._warms: dict[str, WarmBuilder] = {}  # per session, the warm asked for and not started
        self._warming: dict[Take, tuple[str, threading.Event]] = {}  # warms in slots: session, cancel flag
        # Warms ended, by finish reason (metrics; its keys made here: another thread copies it).
        self.warms: collections.Counter[str] = collections.Counter(
            dict.fromkeys(("prefilled", "cached", "cancelled", "error"), 0))
        self.paced = time.monotonic()  # the engine's last pace line (engine/drama3/pace.py)

    def _stopped(self) -> None:
        """Cancel every job; the thread ends once the takes in flight have stopped."""
        for job in (*self._queue, *self._retries, *self._running.values()):
            job.cancel()
        self._warms.clear()
        for _, cancel in self._warming.values():
            cancel.set()

    @property
    def warms_pending(self) -> int:
        """Warms asked for or in slots, not ended yet."""
        with self._condition:
            return len(self._warms) + len(self._warming)

    def warm(self, key: str, build: WarmBuilder) -> None:
        """Prefill the prompt `build` makes into the prefix cache when a slot is idle (key: the
        session; its newer warm replaces one not started yet). Never refused, never queued."""
        with self._condition:
            if self._stopping:
                return
            self._warms[key] = build
            self._condition.notify()

    @property
    def depth(self) -> int:
        """Jobs waiting, not counting the takes in slots."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Takes in the engine's slots (or finishing their last windows), and the one being started."""
        with self._condition:
            return len(self._running) + (self._starting is not None)

    def check_room(self, max_queue: int | None = None) -> None:
        """Raise QueueFull if a job submitted now would be refused (or find `max_queue` jobs waiting: a
        server's own bound, when it shares this loop with others, as tests do)."""
        with self._condition:
            self._check_room(self.max_queue if max_queue is None else min(max_queue, self.max_queue))

    def _check_room(self, max_queue: int) -> None:
        """(Under the lock.)"""
        waiting = len(self._queue)
        if self._stopping:
            raise QueueFull(waiting, 1000)
        if waiting >= max_queue:
            raise self._full(waiting, max_queue)

    def _full(self, waiting: int, max_queue: int) -> QueueFull:
        """QueueFull with the time until one more job fits, from what is ahead (under the lock)."""
        wait, rate = self.wait, self.wait.frame_rate
        running = [*self._running.values(), *([self._starting] if self._starting is not None else [])]
        running_s = [wait.remaining_frames(job.chars, job.sampling.max_new_tokens, job.samples // self.frame_samples)
                     / rate for job in running]
        retries = {id(job) for job in self._retries}
        takes = sorted((job for job in (*self._retries, *self._queue) if isinstance(job, TakeJob)),
                       key=lambda job: job.urgency)
        waiting_s = [(wait.expected_frames(job.chars, job.sampling.max_new_tokens) / rate, id(job) not in retries)
                     for job in takes]
        calls = sum(isinstance(job, CallJob) for job in self._queue)
        seconds = queue_wait(running_s, waiting_s, self.slots, waiting - max_queue + 1 - calls)
        ahead_s = (sum(running_s) + sum(s for s, _ in waiting_s)) / self.slots
        return QueueFull(waiting, round(1000 * max(SOON_S, seconds)), ahead_s)

    def submit(self, job: Job) -> int:
        """Queue a job; returns how many jobs will start before it. Raises QueueFull when the queue is full."""
        with self._condition:
            self._check_room(self.max_queue)
            in_slots = len(self._running) + (self._starting is not None)
            ahead = len(self._queue) + len(self._retries) + max(0, in_slots + 1 - self.slots)
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

    # The engine thread ----------------------------------------------------------

    def _ready(self, engine: Drama3Engine) -> None:
        self.slots, self.frame_samples = engine.slots, engine.frame_samples
        self.warm_up = dict(engine.warm_up())
        step_ms = self.warm_up.get("decode_step_ms")
        if isinstance(step_ms, (int, float)) and step_ms > 0:
            self.wait.frame_rate = 1000 / step_ms  # a take alone; takes that end refine it

    def _serve(self, engine: Drama3Engine) -> None:
        while True:
            with self._condition:
                while not (self._queue or self._retries or self._running or self._warms or self._warming
                           or self._stopping):
                    self._condition.wait()
            turned, cpu = time.perf_counter(), time.thread_time()  # a turn: starts, warms, the step, its events
            with self._condition:
                if self._stopping and not self._running and not self._warming:
                    return
                call = None if self._stopping else self._next_call()
                take = self._starting = None if self._stopping or engine.free_slots == 0 else self._next_take()
            if call is not None:
                self._run_call(call, engine)
            while take is not None:  # starts are cheap (the steps prefill): fill every free slot
                self._begin(take, engine)
                with self._condition:
                    take = self._starting = None if self._stopping or engine.free_slots == 0 else self._next_take()
            self._warm(engine)
            if self._running or self._warming:
                self._step(engine, turned, cpu)

    def _next_call(self) -> CallJob[Any] | None:
        """The oldest waiting call, out of the queue (under the lock)."""
        for job in self._queue:
            if isinstance(job, CallJob):
                self._queue.remove(job)
                return job
        return None

    def _next_take(self) -> TakeJob | None:
        """The waiting take with the earliest deadline, out of its list (under the lock)."""
        waiting = [job for job in (*self._retries, *self._queue) if isinstance(job, TakeJob)]
        if not waiting:
            return None
        job = min(waiting, key=lambda j: j.urgency)
        if job in self._retries:
            self._retries.remove(job)
        else:
            self._queue.remove(job)
        return job

    def _warm(self, engine: Drama3Engine) -> None:
        """Start the waiting warms in free slots when no take waits; a take waiting with every
        slot taken cancels the warms in slots (they free them at the next step)."""
        with self._condition:
            waiting = any(isinstance(job, TakeJob) for job in (*self._retries, *self._queue))
            if waiting and engine.free_slots == 0:
                for _, cancel in self._warming.values():
                    cancel.set()
            if waiting or self._stopping:
                return
            # (Each stays asked for until it is in a slot or done: `warms_pending` never misses it.)
            starting = list(self._warms.items())[:engine.free_slots]
        for key, build in starting:
            cancel = threading.Event()
            take: Take | None = None
            try:
                warm = build(engine)
                take = engine.warm(warm.prompt, cancelled=cancel.is_set, line=warm.line)
            except RequestError as error:  # the line cannot be taken as written (too long): its take says why
                log.info("did not warm the prefix cache for session %s: %s", key[:8], error)
                self.warms["error"] += 1
            except Exception:  # noqa: BLE001 - a warm is an optimisation: its failure is logged, never felt
                log.warning("warming the prefix cache for a session failed:\n%s", traceback.format_exc())
                self.warms["error"] += 1
            else:
                if take is None:  # the cache holds that prefix already (or has no room for it)
                    self.warms["cached"] += 1
            with self._condition:
                if self._warms.get(key) is build:  # (not replaced by a newer warm of the session meanwhile)
                    del self._warms[key]
                if take is not None:
                    self._warming[take] = (key, cancel)

    def _warmed(self, take: Take, done: Done) -> None:
        with self._condition:
            key, _ = self._warming.pop(take)
        self.warms[done.finish_reason] += 1
        start, stop = int(done.timings.get("cached_rows") or 0), take.stop or 0
        log.info("prefix cache warmed for session %s: %s, rows %s to %s (%s ms)%s", key[:8], done.finish_reason,
                 f"{start:,}", f"{stop:,}", done.timings.get("prefill_ms"), f": {done.error}" if done.error else "")

    def _run_call(self, job: CallJob[Any], engine: Drama3Engine) -> None:
        try:
            job.run(engine)
        except BaseException:  # noqa: BLE001 - calls report their own failures; this is a last resort
            log.error("engine call crashed:\n%s", traceback.format_exc())

    def _begin(self, job: TakeJob, engine: Drama3Engine) -> None:
        try:
            job.begin(engine)
        except Exception as error:  # noqa: BLE001 - one take's failure never stops the loop
            log.error("take start failed:\n%s", traceback.format_exc())
            job.take = None
            job.finish("error", f"{type(error).__name__}: {error}")
        finally:
            with self._condition:
                self._starting = None
                if job.take is not None:  # begin started an engine take
                    self._running[job.take] = job

    def _step(self, engine: Drama3Engine, turned: float, cpu: float) -> None:
        """One engine step, its events handed to their jobs; the turn that began at `turned`
        (perf_counter; `cpu`: the thread's time then) reported to the engine's pace."""
        if time.monotonic() - self.paced >= REPORT_S:  # while takes run: how the engine keeps pace
            self.paced = time.monotonic()
            if (line := engine.pace_report()) is not None:
                log.info(line)
        stepped = time.perf_counter()
        try:
            results = engine.step(hand=lambda early: self._hand_early(engine, early))
        except Exception as error:  # noqa: BLE001 - a last resort: the takes in flight end, the loop goes on
            log.error("engine step crashed:\n%s", traceback.format_exc())
            with self._condition:
                running, self._running = self._running, {}
                warming, self._warming = self._warming, {}
            for take, job in running.items():
                engine.drop(take)
                job.finish("error", f"{type(error).__name__}: {error}")
            for take in warming:
                engine.drop(take)
            return
        handing = time.perf_counter()
        self._hand(engine, results)
        done = time.perf_counter()
        engine.pace_turn(done - turned, time.thread_time() - cpu, handing - stepped, done - handing)

    def _hand_early(self, engine: Drama3Engine, results: list[tuple[Take, list[AudioWindow | Done]]]) -> None:
        """Windows vocoded while a step runs on the GPU, to their jobs at once (slots.py
        `hand_ready`: on this thread, inside the step). A job whose handling fails ends after
        the step (`_hand`): nothing ends a take inside it."""
        for take, events in results:
            if (job := self._running.get(take)) is not None and take not in self._failed:
                try:
                    job.handle(engine, events)
                except Exception as error:  # noqa: BLE001 - one take's failure never stops the loop
                    self._failed[take] = error

    def _hand(self, engine: Drama3Engine, results: list[tuple[Take, list[AudioWindow | Done]]]) -> None:
        """Each take's events to its job (or its warm), and the jobs that ended out of the loop."""
        failed, self._failed = self._failed, {}
        ended_early: list[tuple[Take, list[AudioWindow | Done]]] = [  # failed, no events since
            (take, []) for take in failed if take not in dict(results)]
        for take, events in [*results, *ended_early]:
            if take in self._warming:
                if events and isinstance(done := events[-1], Done):
                    self._warmed(take, done)
                continue
            found = self._running.get(take)
            if found is None:
                continue
            job = found
            try:
                if (early := failed.get(take)) is not None:
                    raise early
                progress = job.handle(engine, events)
            except Exception as error:  # noqa: BLE001 - one take's failure never stops the loop
                log.error("take failed:\n%s", traceback.format_exc())
                if not take.done:
                    engine.drop(take)
                job.finish("error", f"{type(error).__name__}: {error}")
                progress = "done"
            if progress == "running":
                continue
            with self._condition:
                del self._running[take]
                if progress == "retry":
                    self._retries.append(job)
                elif (ended := job.ended) is not None:
                    rate = ended.timings.get("decode_frames_per_s")
                    self.wait.finished(job.chars, int(ended.codes.shape[1]),
                                       float(rate) if isinstance(rate, (int, float)) else None,
                                       ended.finish_reason == "stop")

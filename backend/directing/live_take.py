"""`LiveTake`: a queued or running take, between the engine thread and the store and socket.

Design choices:
- It is the engine loop's `TakeSink` (backend/directing/jobs.py): the engine thread posts a
  take's events to it on the event loop, and it writes each to the store before it puts the
  announcing message in the outbox, so what a director heard is stored even after a crash.
  The writes run on the store thread (backend/store_thread.py), never on the event loop, and
  the messages follow in order once each write is done.
- A write that fails (a full disk) stops the take, which ends as an error saying why; so does
  a store that falls MAX_UNWRITTEN writes behind (a frozen disk). If even the end cannot be
  written, `take.done` still goes out (the take is finished as interrupted at the next start).
- Audio goes only to the socket that started the take; `take.done` goes to whichever socket
  holds the session when the take ends (a resumed session learns how its interrupted take
  ended). It reaches those sockets through `SessionSocket` (backend/state.py), so it needs
  nothing of the handlers.
- A full outbox stops the take (the client is not reading its audio).
- The take's audio is gathered as it streams and kept with the take when it ends (PCM16 in
  the store), so playing, reloading and exporting it never call the engine again.
- Its `take.done` message's timings gain `first_audio_sent_ms` (the stored take's do not):
  from the take entering the engine's queue to its first audio frame going into the socket's
  outbox, after its store write. Beside `queue_ms + first_audio_ms` (the engine's side of the
  same span) it says what the store and the hand-off to the event loop add to a director's
  first audio.
- While the server stops (`state.closing`) events are dropped: the next start finishes the
  take as an error, with the windows it stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import cast

import numpy as np

from backend.directing import protocol as p
from backend.directing.jobs import TakeJob, TakeOutcome
from backend.state import ServerState, SessionSocket
from backend.store import StoredTake, audio_url
from backend.store_thread import problem
from backend.transport import pack_audio_frame
from engine import AudioWindow, Sampling

MAX_UNWRITTEN = 64  # a take's events waiting for the store (windows of up to 64 frames: minutes of audio)
NOT_READING = "the client is not reading audio fast enough; the take was stopped"


def sampling_info(sampling: Sampling) -> p.SamplingInfo:
    """The wire form of a take's settings: the engine's fields as they are (the seed is set)."""
    assert sampling.seed is not None
    return cast(p.SamplingInfo, dataclasses.asdict(sampling))


class LiveTake:
    """A queued or running take: the engine thread's sink, on the event loop."""

    def __init__(self, state: ServerState, session: SessionSocket, take: StoredTake, history: list[int]) -> None:
        self.state = state
        self.session = session  # the socket that started it (its audio goes there only)
        self.session_id = take.session_id
        self.take_id = take.take_id
        self.requested_history = history
        self.seq = 0
        self.pcm: list[np.ndarray] = []  # the current attempt's audio, kept with the take when it ends
        self.job: TakeJob | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.finished = False
        self.loop = asyncio.get_running_loop()
        self.unwritten = 0  # events whose store write has not finished yet
        self.store_error: str | None = None  # why the store could not keep this take
        self.first_sent: float | None = None  # time.monotonic() when its first audio frame went out

    def cancel(self, reason: str | None = None) -> None:
        """Stop the take: now if still queued, at the engine's next step if running. With a
        reason (the server's, not the director's) it ends as an error that says it."""
        if self.job is None or self.finished:
            return
        if reason is None:
            self.job.cancel()
        else:
            self.job.fail(reason)
        if self.state.engine_loop.withdraw(self.job):
            queued: dict[str, float | int | None] = {"queue_ms": self.queued_ms()}
            self.done(TakeOutcome("cancelled", queued, None, 0, 0) if reason is None else
                      TakeOutcome("error", queued, None, 0, 0, reason))

    def expire(self) -> None:
        """The deadline passed; a take still in the queue ends here (a running one in the engine)."""
        if self.job is not None and self.state.engine_loop.withdraw(self.job):
            self.done(TakeOutcome("deadline", {"queue_ms": self.queued_ms()}, None, 0, 0))

    def queued_ms(self) -> int:
        return 0 if self.job is None else round((time.monotonic() - self.job.submitted) * 1000)

    # TakeSink ---------------------------------------------------------------

    def stored(self, write: Callable[[], object], announce: Callable[[], None]) -> None:
        """`write` on the store thread, then `announce` here: in order, never on the event loop.
        A write that fails (a full disk) stops the take with what went wrong; a store that falls
        far behind (a frozen disk) stops it too, rather than holding its audio without bound."""
        if self.unwritten >= MAX_UNWRITTEN:
            self.store_failed(None)
            return
        self.unwritten += 1

        def written() -> None:
            self.unwritten -= 1
            if not self.state.closing and self.store_error is None:
                announce()

        def failed(error: BaseException) -> None:
            self.unwritten -= 1
            self.store_failed(error)

        self.state.db.then(self.loop, write, written, failed)

    def store_failed(self, error: BaseException | None) -> None:
        if self.store_error is None:
            self.store_error = (problem(error) if error is not None else
                                f"the server's disk fell {MAX_UNWRITTEN} writes behind, so this take was stopped")
            if self.job is not None:
                self.job.fail(self.store_error)

    def started(self, attempt: int, sampling: Sampling) -> None:
        if self.state.closing:
            return
        info = sampling_info(sampling)
        self.seq = 0
        self.pcm = []
        self.stored(lambda: self.state.store.start_take(self.take_id, attempt, info),
                    lambda: self.session.outbox.message(p.TakeStarted(self.take_id, attempt, info)))

    def history(self, used: int) -> None:
        if self.state.closing:
            return
        ids = self.requested_history
        kept, dropped = ids[len(ids) - used:] if used else [], ids[: len(ids) - used]
        self.stored(lambda: self.state.store.set_history(self.take_id, kept, dropped),
                    lambda: self.session.outbox.message(p.History(kept, dropped, self.take_id)))

    def window(self, attempt: int, window: AudioWindow) -> None:
        if self.state.closing:
            return
        seq = self.seq
        self.pcm.append(np.asarray(window.pcm, dtype=np.int16))
        frame = pack_audio_frame(self.take_id, seq, window.start_sample,
                                 np.ascontiguousarray(window.pcm, dtype="<i2").tobytes(), last=window.last)
        self.seq += 1

        def write() -> None:  # written before it is sent: a crash keeps what the director heard
            if window.frames:
                self.state.store.add_take_window(self.take_id, seq, window.codes, len(window.pcm))

        def send() -> None:
            if not self.session.outbox.audio(frame) and self.job is not None:
                self.job.fail(NOT_READING)
            elif self.first_sent is None and len(window.pcm):
                self.first_sent = time.monotonic()

        self.stored(write, send)

    def retry(self, attempt: int, message: str) -> None:
        if self.state.closing:
            return
        self.state.metrics.retries += 1
        self.stored(lambda: None,  # nothing to write; after the last attempt's windows, in order
                    lambda: self.session.outbox.message(p.TakeRetry(self.take_id, attempt, "silence", message)))

    def done(self, outcome: TakeOutcome) -> None:
        if self.finished or self.state.closing:  # stopping: the next start finishes the take as an error
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
        if self.store_error is not None and outcome.finish_reason != "error":
            outcome = dataclasses.replace(outcome, finish_reason="error", error=self.store_error)
        pcm = np.concatenate(self.pcm) if self.pcm else None
        if pcm is not None and len(pcm) != outcome.samples:  # not the whole take: the export vocodes its codes
            pcm = None
        self.pcm = []
        sample_rate = self.state.engine.sample_rate

        def write() -> None:
            self.state.store.finish_take(self.take_id, outcome.finish_reason, error=outcome.error,
                                         timings=outcome.timings, samples=outcome.samples,
                                         attempts=outcome.attempts, codes=outcome.codes, pcm=pcm,
                                         sample_rate=sample_rate)

        def announce(result: TakeOutcome = outcome) -> None:
            self.state.metrics.take_done(result.finish_reason, result.timings)
            frames = 0 if result.codes is None else int(result.codes.shape[1])
            timings = result.timings
            if self.first_sent is not None and self.job is not None:  # (its windows went out before: writes in order)
                timings = {**timings, "first_audio_sent_ms": round((self.first_sent - self.job.submitted) * 1000, 1)}
            message = p.TakeDone(self.take_id, result.finish_reason, timings, frames, result.samples,
                                 result.attempts, audio_url(self.session_id, self.take_id), result.error)
            holder = self.state.sessions.get(self.session_id, self.session)
            holder.outbox.message(message)
            for session in (self.session, holder):
                session.take_ended(self.take_id)

        def failed(error: BaseException) -> None:  # the end is not stored: the take still ends, saying why
            if not self.state.closing:
                announce(dataclasses.replace(outcome, finish_reason="error", error=self.store_error or problem(error)))

        def written() -> None:
            if not self.state.closing:
                announce()

        self.state.db.then(self.loop, write, written, failed)

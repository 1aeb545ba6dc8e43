"""`LiveTake`: a queued or running take, between the engine thread and the store and socket.

Design choices:
- It is the engine loop's `TakeSink` (backend/directing/jobs.py): the engine thread posts a
  take's events to it on the event loop, and it writes each to the store before it puts the
  announcing message in the outbox, so what a director heard is stored even after a crash.
- Audio goes only to the socket that started the take; `take.done` goes to whichever socket
  holds the session when the take ends (a resumed session learns how its interrupted take
  ended). It reaches those sockets through `SessionSocket` (backend/state.py), so it needs
  nothing of the handlers.
- A full outbox stops the take (the client is not reading its audio).
- The take's audio is gathered as it streams and kept with the take when it ends (PCM16 in
  the store), so playing, reloading and exporting it never call the engine again.
- While the server stops (`state.closing`) events are dropped: the next start finishes the
  take as an error, with the windows it stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import cast

import numpy as np

from backend.directing import protocol as p
from backend.directing.jobs import TakeJob, TakeOutcome
from backend.state import ServerState, SessionSocket
from backend.store import StoredTake, audio_url
from backend.transport import pack_audio_frame
from engine import AudioWindow, Sampling

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

    def started(self, attempt: int, sampling: Sampling) -> None:
        if self.state.closing:
            return
        info = sampling_info(sampling)
        self.state.store.start_take(self.take_id, attempt, info)
        self.seq = 0
        self.pcm = []
        self.session.outbox.message(p.TakeStarted(self.take_id, attempt, info))

    def history(self, used: int) -> None:
        if self.state.closing:
            return
        ids = self.requested_history
        kept, dropped = ids[len(ids) - used:] if used else [], ids[: len(ids) - used]
        self.state.store.set_history(self.take_id, kept)
        self.session.outbox.message(p.History(kept, dropped, self.take_id))

    def window(self, attempt: int, window: AudioWindow) -> None:
        if self.state.closing:
            return
        if window.frames:  # written before it is sent: a crash keeps what the director heard
            self.state.store.add_take_window(self.take_id, self.seq, window.codes, len(window.pcm))
        self.pcm.append(np.asarray(window.pcm, dtype=np.int16))
        frame = pack_audio_frame(self.take_id, self.seq, window.start_sample,
                                   np.ascontiguousarray(window.pcm, dtype="<i2").tobytes(), last=window.last)
        self.seq += 1
        if not self.session.outbox.audio(frame) and self.job is not None:
            self.job.fail(NOT_READING)

    def retry(self, attempt: int, message: str) -> None:
        if self.state.closing:
            return
        self.state.metrics.retries += 1
        self.session.outbox.message(p.TakeRetry(self.take_id, attempt, "silence", message))

    def done(self, outcome: TakeOutcome) -> None:
        if self.finished or self.state.closing:  # stopping: the next start finishes the take as an error
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
        pcm = np.concatenate(self.pcm) if self.pcm else None
        if pcm is not None and len(pcm) != outcome.samples:  # not the whole take: the export vocodes its codes
            pcm = None
        self.state.store.finish_take(self.take_id, outcome.finish_reason,
                                     error=outcome.error, timings=outcome.timings, samples=outcome.samples,
                                     attempts=outcome.attempts, codes=outcome.codes, pcm=pcm,
                                     sample_rate=self.state.engine.sample_rate)
        self.pcm = []
        self.state.metrics.take_done(outcome.finish_reason, outcome.timings)
        frames = 0 if outcome.codes is None else int(outcome.codes.shape[1])
        message = p.TakeDone(self.take_id, outcome.finish_reason, outcome.timings, frames, outcome.samples,
                             outcome.attempts, audio_url(self.session_id, self.take_id), outcome.error)
        holder = self.state.sessions.get(self.session_id, self.session)
        holder.outbox.message(message)
        for session in (self.session, holder):
            session.take_ended(self.take_id)

"""A take started before the store has checked it (an early start), on the prompt its warm read.

    early = start_early(state, warmed.take, sampling, deadline, guard)  # a take of the line as warmed
    ...                                                     # meanwhile the store checks and stores the take
    early.held.attach(live)                                 # its digest is the store's: after take.queued
    discard(state, early, "dropped")                        # or not (or "refused"): it never happened

Design choices:
- A take's prompt is made of its text, its voice and the kept takes it hears, all read from
  the store (directing/session.py `checked_take`: ~10 statements, the insert included, ~5 ms
  on 2 CPU cores and 7-11 ms before take.queued on the H200's host). The warm of the line to
  take next read the same things a moment before (directing/warming.py), so a take of that
  line as the script holds it can start in the engine at once, while the store checks and
  stores it; on the GPU its first audio is then the engine's alone.
- Never a different take: when the store has read the take's own inputs, their digest is
  compared with the early prompt's. Equal, the early job goes on (the same inputs laid out
  the same way make the same rows); different (the scene changed in between, e.g. from
  another socket), it is cancelled and the take starts as it would have without it. A take
  the store refuses cancels it too. The seed and the length guard are chosen before, so the
  store records what the early job runs.
- Nothing reaches the director before take.queued: the early job's events wait in `Held`
  (on the event loop) until the take is stored and announced, then go to its LiveTake in
  order; a dropped one's events are discarded.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from backend.directing.cast import EngineVoice
from backend.directing.jobs import SilenceGuard, TakeJob, TakeOutcome, TakeSink
from backend.directing.loop import QueueFull
from backend.state import ServerState
from engine import AudioWindow, Character, Drama3Engine, HistoryTurn, Prompt, Sampling


@dataclass(frozen=True)
class TakePrompt:
    """What a take's prompt is made of: its text, its voice and the kept takes it hears (read
    from the store); `prompt` lays them out, on the engine thread."""

    text: str
    voice: EngineVoice
    turns: list[HistoryTurn]
    max_rows: int | None

    def prompt(self, engine: Drama3Engine, sampling: Sampling) -> Prompt:
        return engine.prompt(self.text, self.voice, self.turns, sampling, drop_oldest_history=True,
                             max_rows=self.max_rows)

    @functools.cached_property
    def digest(self) -> bytes:
        """Equal digests, equal prompts: every input, codes to the byte (a history's codes are
        ~1 ms of hashing: made on the store thread, where the prompt was read, never on the
        event loop)."""
        digest = hashlib.sha256()

        def add(*parts: object) -> None:
            for part in parts:
                data = (part.tobytes() + str(part.shape).encode() if isinstance(part, np.ndarray)
                        else repr(part).encode())
                digest.update(len(data).to_bytes(8, "little") + data)

        add(self.text, self.max_rows, type(self.voice).__name__)
        if isinstance(self.voice, Character):
            add(self.voice)
        elif self.voice is not None:
            for reference in self.voice:
                add(reference.transcript, reference.codes)
        for turn in self.turns:
            add(turn.text, turn.speaker, turn.codes)
        return digest.digest()


class Held:
    """A TakeSink that holds an early job's events (on the event loop) until `attach` hands
    them, and every later one, to the take's LiveTake; after `drop`, events are discarded."""

    def __init__(self) -> None:
        self.events: list[Callable[[TakeSink], None]] = []
        self.sink: TakeSink | None = None
        self.dropped = False

    def attach(self, sink: TakeSink) -> None:
        self.sink = sink
        events, self.events = self.events, []
        for event in events:
            event(sink)

    def drop(self) -> None:
        self.dropped, self.events = True, []

    def _pass(self, event: Callable[[TakeSink], None]) -> None:
        if self.sink is not None:
            event(self.sink)
        elif not self.dropped:
            self.events.append(event)

    def started(self, attempt: int, sampling: Sampling) -> None:
        self._pass(lambda sink: sink.started(attempt, sampling))

    def history(self, used: int) -> None:
        self._pass(lambda sink: sink.history(used))

    def window(self, attempt: int, window: AudioWindow) -> None:
        self._pass(lambda sink: sink.window(attempt, window))

    def retry(self, attempt: int, message: str) -> None:
        self._pass(lambda sink: sink.retry(attempt, message))

    def done(self, outcome: TakeOutcome) -> None:
        self._pass(lambda sink: sink.done(outcome))


@dataclass(frozen=True)
class Early:
    """An early start: its job (in the engine loop at `position`), the sink holding its events,
    and the prompt it runs."""

    job: TakeJob
    held: Held
    take_prompt: TakePrompt
    position: int


def start_early(state: ServerState, take_prompt: TakePrompt, sampling: Sampling, deadline: float,
                guard: SilenceGuard | None) -> Early | None:
    """The take in the engine now, on `take_prompt` (what the line's warm read); None when early
    starts are off, or the engine's queue is full (the take then waits for the store's checks)."""
    if not state.settings.early_start:
        return None
    held = Held()
    job = TakeJob(take_prompt.prompt, sampling, held, asyncio.get_running_loop(), deadline, guard,
                  chars=len(take_prompt.text))
    try:
        position = state.engine_loop.submit(job)
    except QueueFull:
        return None
    return Early(job, held, take_prompt, position)


def discard(state: ServerState, early: Early, result: str) -> None:
    """An early start the store refused, or whose prompt was not the take's: it never happened
    (`result`: what /metrics counts it as)."""
    early.held.drop()
    early.job.cancel()
    state.engine_loop.withdraw(early.job)
    state.metrics.early_starts[result] += 1

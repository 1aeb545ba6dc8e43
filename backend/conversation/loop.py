"""Live conversations with the PersonaPlex engine: one thread owns it and ticks every slot together.

    loop = ConversationLoop(lambda: PersonaPlex.load(...))
    loop.start()                                   # loads the engine; raises what loading raised
    talk = await loop.join(persona, voice, seed, sink)  # a slot; its system prompt runs next
    loop.feed(talk, pcm16_bytes)                   # the user's audio, any length
    loop.leave(talk)                               # the slot is free again

Design choices:
- Ticks as frames arrive (continuous batching): a tick runs as soon as any listening
  conversation has a frame of its user's queued, and moves on exactly those (the engine's
  `step(..., hearing)`: the others keep their place, their Mimi streams and their step, as
  if the tick had not run for them). Nobody waits for anyone else's audio: a frame waits at
  most for the tick running when it came, then its own (on the H200 the lockstep form,
  which waited for every conversation's frame, answered 64 talking conversations 153 ms
  p50 after they spoke, for a 43 ms tick: their frames arrive at any phase of the 80 ms).
  A backlog (frames that piled up while the loop was slow, a file sent at once) drains at
  a frame a tick, as fast as the ticks run. A conversation still in its system prompt
  needs no audio: it reads a chunk of it at each tick, tick after tick until it listens.
  So one user is answered as fast as their audio arrives, and a recorded file is answered
  faster than real time.
- Everything that touches the engine (starting a slot, ticks) runs on this thread
  (backend/engine_thread.py, as the Drama 3 loop's); the event loop only queues audio and
  requests under the condition's lock, and the thread reaches the event loop through
  `call_soon_threadsafe` (the sink's callbacks).
- Audio a user sends before `listening` is dropped: the agent is not listening yet, and
  keeping it would put the user's words late for the whole conversation.
- Joins start on this thread between ticks, at most STARTS_PER_TICK between two (every join
  queued was started before the next tick): on the H200 (stop 48) with 127 conversations
  opened at once, those already listening piled up frames, most likely while the others
  started, and the first second's frames waited (tick latency p99 1.1 s while the ticks took
  p95 27 ms; the pace line heard 19,425 frames in 10 s where the users sent 15,875). A start
  (a read prompt copied in, the slot's streams reset; its plan kept from the last start with
  that persona and voice, engine/personaplex/plans.py: 1.0 ms against 14.5 planned, on 2 CPU
  cores) is a few launches; eight of them hold a tick back for little. A named voice is
  started by its name, so the plan is found. The pace line says what the starts and the
  backlog were.
- Idle slots wait (no tick moves them); a conversation that ends releases its slot
  (engine.release) and a new one recycles it (engine.start), which forgets the slot's
  history. A tick runs only up to the highest slot in use (the engine's batch buckets),
  and a new conversation takes the lowest free slot, so ticks stay as small as they can.
- Every REPORT_S (10 s) while conversations talk, the ticks' pace goes to the log in a line
  (pace.py: the step's time, the wait between ticks, conversations heard per tick), as
  the Drama 3 loop's does.
- `seed` seeds the conversation's own draws (the engine's are per slot, counter-based), so
  a seeded conversation is reproducible whoever else is talking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backend.conversation.pace import TickPace
from backend.engine_thread import EngineThread, post
from engine.drama3.pace import REPORT_S
from engine.errors import RequestError
from engine.personaplex import DEFAULT_PERSONA, PersonaPlex

log = logging.getLogger("retake.conversation")
MAX_QUEUED_SECONDS = 60.0  # user audio waiting to be heard; past it the client sends faster than we tick
STARTS_PER_TICK = 8  # joins started between two ticks at most (the design choices)


Call = tuple["Conversation", Callable[..., None], tuple[object, ...]]  # a sink's callback and its arguments


class NoFreeSlot(Exception):
    """Every slot holds a conversation."""


class TooFast(Exception):
    """A client sent more audio than the conversation can hear soon."""


class ConversationSink(Protocol):
    """Called on the event loop thread."""

    def listening(self) -> None: ...

    def frame(self, tick: int, pcm: np.ndarray, text: str | None) -> None: ...

    def failed(self, message: str) -> None: ...


@dataclass(eq=False)
class Conversation:
    slot: int
    sink: ConversationSink
    loop: asyncio.AbstractEventLoop
    frame_samples: int
    voice: str | None = None  # the voice's name, once the conversation started
    listening: bool = False
    ticks: int = 0  # agent frames sent since listening
    frames: deque[np.ndarray] = field(default_factory=deque)  # float32 [frame_samples] each, the user's
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # an unfinished frame's samples
    closed: bool = False

    def post(self, fn: Callable[..., None], *args: object) -> None:
        if not self.closed:
            post(self.loop, fn, *args)


@dataclass
class _Join:
    persona: str
    voice: str | None
    clip: bytes | None  # a WAV/FLAC file: its voice, Mimi-encoded, instead of a named one
    seed: int | None
    conversation: Conversation
    done: Future[None] = field(default_factory=Future)


class ConversationLoop(EngineThread[PersonaPlex]):
    def __init__(self, load: Callable[[], PersonaPlex]) -> None:
        super().__init__(load, "conversation-engine")
        self.voices: list[str] = []  # the engine's voice names (set when it is loaded)
        self.default_voice: str | None = None  # the voice of a converse.open without one (None: no voices)
        self._joins: deque[_Join] = deque()
        self._starting: set[int] = set()  # slots of joins the engine thread took and is starting
        self._talks: dict[int, Conversation] = {}  # slot -> conversation
        self._released: list[int] = []  # slots left since the last tick, released by the engine thread
        self.pace = TickPace()  # the ticks' pace, a log line every REPORT_S while conversations talk (pace.py)

    @property
    def sample_rate(self) -> int:
        assert self.engine is not None
        return self.engine.sample_rate

    @property
    def frame_samples(self) -> int:
        assert self.engine is not None
        return self.engine.frame_size

    # The event loop's side ------------------------------------------------------------

    async def join(self, persona: str | None, voice: str | None, seed: int | None, sink: ConversationSink,
                   clip: bytes | None = None) -> Conversation:
        """A slot for a new conversation, once its system prompt is queued (RequestError: a bad
        persona or voice; NoFreeSlot: no slot is free)."""
        with self._condition:
            # A join the engine thread is starting is in neither _joins nor _talks yet: its slot is taken too.
            used = set(self._talks) | self._starting | {j.conversation.slot for j in self._joins}
            free = [slot for slot in range(self.slots) if slot not in used]
            if not free:
                raise NoFreeSlot(f"all {self.slots} conversation slots are in use; try again later")
            talk = Conversation(free[0], sink, asyncio.get_running_loop(), self.frame_samples)
            join = _Join(DEFAULT_PERSONA if persona is None else persona, voice, clip, seed, talk)
            self._joins.append(join)
            self._condition.notify_all()
        await asyncio.wrap_future(join.done)
        return talk

    @property
    def active(self) -> int:
        """Conversations holding a slot."""
        with self._condition:
            return len(self._talks)

    def system_prompts(self) -> dict[str, int]:
        """Conversations started by how their system prompt was: read, or copied (read before)."""
        prompts = self.engine.read_prompts if self.engine is not None else None
        return {} if prompts is None else {"read": prompts.misses, "copied": prompts.hits}

    @property
    def slots(self) -> int:
        assert self.engine is not None
        return self.engine.slots

    def feed(self, talk: Conversation, pcm16: bytes) -> None:
        """The user's audio (PCM16 LE); dropped until the conversation listens."""
        if len(pcm16) % 2:
            raise RequestError("audio frames must hold whole 16-bit samples (an even number of bytes)")
        self.feed_samples(talk, np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0)

    def feed_samples(self, talk: Conversation, samples: np.ndarray) -> None:
        """The user's audio, float32 [N] in [-1, 1] (decoded Opus on /api/chat); dropped until the
        conversation listens."""
        with self._condition:
            if not talk.listening or talk.closed:
                return
            data = np.concatenate([talk.partial, np.asarray(samples, dtype=np.float32)])  # [N]
            whole = len(data) - len(data) % talk.frame_samples
            for start in range(0, whole, talk.frame_samples):
                talk.frames.append(data[start:start + talk.frame_samples])  # [frame_samples]
            talk.partial = data[whole:]
            if len(talk.frames) * talk.frame_samples > MAX_QUEUED_SECONDS * self.sample_rate:
                raise TooFast(f"more than {MAX_QUEUED_SECONDS:.0f} s of audio is waiting to be heard; "
                              "send it no faster than it plays")
            self._condition.notify_all()

    def leave(self, talk: Conversation) -> None:
        with self._condition:
            talk.closed = True
            if self._talks.get(talk.slot) is talk:
                del self._talks[talk.slot]
                self._released.append(talk.slot)
            self._condition.notify_all()

    # The engine thread ----------------------------------------------------------------

    def _ready(self, engine: PersonaPlex) -> None:
        self.voices = engine.voice_names()
        default = engine.voice()
        self.default_voice = None if default is None else default.name

    def _serve(self, engine: PersonaPlex) -> None:
        silence = np.zeros((engine.slots, engine.frame_size), dtype=np.float32)
        ended = reported = time.monotonic()
        while True:
            with self._condition:
                while not self._stopping and not self._joins and not tick_due(self._talks.values()):
                    self._condition.wait()
                if self._stopping:
                    return
                joins = [self._joins.popleft() for _ in range(min(STARTS_PER_TICK, len(self._joins)))]
                self._starting.update(join.conversation.slot for join in joins)
                released = [slot for slot in self._released if slot not in self._talks]
                self._released.clear()
            for slot in released:
                engine.release(slot)
            if joins:
                starting = time.monotonic()
                for join in joins:
                    self._start(engine, join)
                self.pace.started(len(joins), time.monotonic() - starting)
            with self._condition:
                if self._stopping or not tick_due(self._talks.values()):
                    continue
                user = silence.copy()
                heard: set[int] = set()  # the listening conversations this tick hears
                for talk in self._talks.values():
                    if talk.listening and talk.frames:
                        user[talk.slot] = talk.frames.popleft()
                        heard.add(talk.slot)
                talks = dict(self._talks)
                prompting = {slot for slot, talk in talks.items() if not talk.listening}
                backlog = max((len(talk.frames) for talk in talks.values() if talk.listening), default=0)
            started = time.monotonic()
            if started - reported >= REPORT_S:
                reported = started
                if (line := self.pace.report()) is not None:
                    log.info(line)
            try:
                # Only the conversations heard move on: one whose system prompt ends in this tick listens
                # from the next (its first tick hears its user, as after a prompt read before, read_prompts.py).
                frames = engine.step(user, heard)
            except Exception as error:
                log.exception("a conversation tick failed")
                for talk in talks.values():
                    talk.post(talk.sink.failed, f"the conversation engine failed: {type(error).__name__}: {error}")
                    self.leave(talk)
                continue
            self.pace.tick(time.monotonic() - started, started - ended, len(heard), len(prompting),
                           chunk=engine.timings.get("prompt_ms", 0.0) > 0, backlog=backlog)
            calls: dict[asyncio.AbstractEventLoop, list[Call]] = {}
            for slot, talk in talks.items():
                if slot in heard and (out := frames[slot]) is not None:
                    calls.setdefault(talk.loop, []).append((talk, talk.sink.frame, (talk.ticks, out.pcm, out.text)))
                    talk.ticks += 1
                elif slot in prompting and not engine.prefilling(slot):
                    with self._condition:
                        talk.listening = True
                    calls.setdefault(talk.loop, []).append((talk, talk.sink.listening, ()))
            for loop, batch in calls.items():  # one wake-up of each event loop a tick, not one per conversation
                post(loop, deliver, batch)
            ended = time.monotonic()  # the frames handed out: from here the loop waits for audio

    def _start(self, engine: PersonaPlex, join: _Join) -> None:
        try:
            if not join.done.set_running_or_notify_cancel():  # the socket's handler was cancelled meanwhile
                return
            error = self._start_slot(engine, join)
        finally:  # after the conversation is in _talks (or refused): its slot is never free in between
            with self._condition:
                self._starting.discard(join.conversation.slot)
        # Only now the socket hears how it went: a refused join's slot is already free for the next
        # one (a client told "no" that connects again at once must not find its own slot taken).
        if error is not None:
            join.done.set_exception(error)
        else:
            join.done.set_result(None)

    def _start_slot(self, engine: PersonaPlex, join: _Join) -> RequestError | None:
        """Start the join's conversation in its slot (then it is in _talks); the error that refuses it."""
        talk = join.conversation
        try:
            if join.voice is not None and join.voice not in self.voices:  # a name, never a path on the server
                raise RequestError(f"unknown voice {join.voice!r}; the voices are {', '.join(self.voices) or 'none'}")
            if join.clip is not None:
                voice = engine.clip_voice(join.clip)
                engine.start(talk.slot, join.persona, voice, seed=join.seed)
                talk.voice = voice.name
            else:  # by name (None: no voice in the checkpoint): a persona and voice seen before are not planned again
                talk.voice = self.default_voice if join.voice is None else join.voice
                engine.start(talk.slot, join.persona, talk.voice, seed=join.seed)
        except RequestError as error:
            return error
        except Exception as error:  # a fault of ours: logged; the client gets a line, not internals
            log.exception("a conversation could not start")
            return RequestError(f"the conversation could not start (a server fault: {type(error).__name__}); "
                                "try again")
        with self._condition:
            if not talk.closed:
                self._talks[talk.slot] = talk
                # A prompt read before was copied in (read_prompts.py): it listens now, no tick needed. (The
                # socket sends converse.ready before anything its sink queues: listening comes after it.)
                talk.listening = not engine.prefilling(talk.slot)
        if talk.closed:  # the client left while its slot started
            engine.release(talk.slot)
        elif talk.listening:
            talk.post(talk.sink.listening)
        return None


def tick_due(talks: Iterable[Conversation]) -> bool:
    """A tick is due: a listening conversation has a frame queued, or one is reading its system prompt."""
    return any(talk.frames if talk.listening else True for talk in talks)


def deliver(calls: list[Call]) -> None:
    """A tick's callbacks to its conversations' sinks, on their event loop (those still open)."""
    for talk, fn, args in calls:
        if not talk.closed:
            try:
                fn(*args)
            except Exception:  # one socket's fault stays its own, as when each call was posted alone
                log.exception("a conversation's frame could not be handed to its socket")

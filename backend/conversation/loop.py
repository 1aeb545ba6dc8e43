"""Live conversations with the PersonaPlex engine: one thread owns it and ticks every slot together.

    loop = ConversationLoop(lambda: PersonaPlex.load(...))
    loop.start()                                   # loads the engine; raises what loading raised
    talk = await loop.join(persona, voice, seed, sink)  # a slot; its system prompt runs next
    loop.feed(talk, pcm16_bytes)                   # the user's audio, any length
    loop.leave(talk)                               # the slot is free again

Design choices:
- Ticks are paced by the users' audio, not by a clock: a tick runs when every listening
  conversation has a frame queued, or when one has waited TICK_GRACE_S (then the late ones get
  silence for that tick, their frames flagged `heard=False`: a late client must not hold up
  the others). A conversation still in its system prompt needs no audio: it advances with the
  others' ticks (at least one per TICK_GRACE_S), or tick after tick when nobody is listening.
  So one user is answered as fast as their audio arrives, and a recorded file is answered
  faster than real time.
- Catching up: ticks that consume one frame each never shrink a queue, so frames that piled
  up while the loop was slow (system prompts started while others listened, a tick that
  outgrew the frame) would stay queued, and late, for the rest of the conversation (on the
  H200, 64 talking conversations heard their answers 153 ms p50 after speaking, for a 43 ms
  tick). So a tick also runs at once when a listening conversation is behind: two or more
  frames queued that arrived at least a tick apart (its user talks in real time and the
  loop fell a whole tick behind them); the others without a frame are fed silence. Frames
  that arrived together (a file sent at once, a burst after a network stall) do not count:
  a client that sends faster than real time is paced by the others' ticks, and never makes
  them hear silence.
- Everything that touches the engine (starting a slot, ticks) runs on this thread
  (backend/engine_thread.py, as the Drama 3 loop's); the event loop only queues audio and
  requests under the condition's lock, and the thread reaches the event loop through
  `call_soon_threadsafe` (the sink's callbacks).
- Audio a user sends before `listening` is dropped: the agent is not listening yet, and
  keeping it would put the user's words late for the whole conversation.
- Idle slots are fed silence and wait; a conversation that ends releases its slot
  (engine.release) and a new one recycles it (engine.start), which forgets the slot's
  history. A tick runs only up to the highest slot in use (the engine's batch buckets),
  and a new conversation takes the lowest free slot, so ticks stay as small as they can.
- Every REPORT_S (10 s) while conversations talk, the ticks' pace goes to the log in a line
  (pace.py: the step's time, the wait between ticks, conversations per tick, silence fed
  to the late), as the Drama 3 loop's does.
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
from engine.personaplex import DEFAULT_PERSONA, PersonaPlex, Voice

log = logging.getLogger("retake.conversation")
TICK_S = 0.08  # the audio of one tick (PersonaPlex's 12.5 Hz frames)
TICK_GRACE_S = TICK_S  # how long a queued frame waits for the other conversations
MAX_QUEUED_SECONDS = 60.0  # user audio waiting to be heard; past it the client sends faster than we tick


Call = tuple["Conversation", Callable[..., None], tuple[object, ...]]  # a sink's callback and its arguments


class NoFreeSlot(Exception):
    """Every slot holds a conversation."""


class TooFast(Exception):
    """A client sent more audio than the conversation can hear soon."""


class ConversationSink(Protocol):
    """Called on the event loop thread."""

    def listening(self) -> None: ...

    def frame(self, tick: int, pcm: np.ndarray, text: str | None, heard: bool) -> None:
        """The agent's audio of one tick; `heard`: the tick heard a frame of the user's (False:
        silence stood in, the user's audio came late)."""

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
    arrived: deque[float] = field(default_factory=deque)  # when each queued frame arrived (monotonic)
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # an unfinished frame's samples
    waiting_since: float | None = None  # since when the first queued frame waits (the last tick, for a backlog)
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
            now = time.monotonic()
            for start in range(0, whole, talk.frame_samples):
                talk.frames.append(data[start:start + talk.frame_samples])  # [frame_samples]
                talk.arrived.append(now)
            talk.partial = data[whole:]
            if len(talk.frames) * talk.frame_samples > MAX_QUEUED_SECONDS * self.sample_rate:
                raise TooFast(f"more than {MAX_QUEUED_SECONDS:.0f} s of audio is waiting to be heard; "
                              "send it no faster than it plays")
            if whole and talk.waiting_since is None:
                talk.waiting_since = now
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
        last_tick = ended = reported = time.monotonic()
        while True:
            with self._condition:
                while not self._stopping and not self._joins and \
                        (wait := wait_s(self._talks.values(), last_tick, time.monotonic())) != 0:
                    self._condition.wait(wait)
                if self._stopping:
                    return
                joins = list(self._joins)
                self._joins.clear()
                self._starting.update(join.conversation.slot for join in joins)
                released = [slot for slot in self._released if slot not in self._talks]
                self._released.clear()
                if joins:  # start them first: a slot's system prompt begins at the next tick
                    user = None
                else:
                    user = silence.copy()
                    heard: set[int] = set()
                    behind = is_behind(self._talks.values()) and \
                        not all(t.frames for t in self._talks.values() if t.listening)  # a tick early, to catch up
                    for talk in self._talks.values():
                        if talk.listening and talk.frames:
                            user[talk.slot] = talk.frames.popleft()
                            talk.arrived.popleft()
                            heard.add(talk.slot)
                        talk.waiting_since = time.monotonic() if talk.frames else None
                    talks = dict(self._talks)
                    listening = sum(talk.listening for talk in talks.values())
            for slot in released:
                engine.release(slot)
            for join in joins:
                self._start(engine, join)
            if user is None:
                continue
            last_tick = time.monotonic()
            if last_tick - reported >= REPORT_S:
                reported = last_tick
                if (line := self.pace.report()) is not None:
                    log.info(line)
            try:
                frames = engine.step(user)
            except Exception as error:
                log.exception("a conversation tick failed")
                for talk in talks.values():
                    talk.post(talk.sink.failed, f"the conversation engine failed: {type(error).__name__}: {error}")
                    self.leave(talk)
                continue
            self.pace.tick(time.monotonic() - last_tick, last_tick - ended, listening, len(talks) - listening,
                           listening - len(heard), behind)
            calls: dict[asyncio.AbstractEventLoop, list[Call]] = {}
            for slot, talk in talks.items():
                if talk.listening:
                    out = frames[slot]
                    pcm = out.pcm if out is not None else silence[slot]
                    text = None if out is None else out.text
                    calls.setdefault(talk.loop, []).append((talk, talk.sink.frame, (talk.ticks, pcm, text,
                                                                                      slot in heard)))
                    talk.ticks += 1
                elif not engine.prefilling(slot):
                    with self._condition:
                        talk.listening = True
                    calls.setdefault(talk.loop, []).append((talk, talk.sink.listening, ()))
            for loop, batch in calls.items():  # one wake-up of each event loop a tick, not one per conversation
                post(loop, deliver, batch)
            ended = time.monotonic()  # the frames handed out: from here the loop waits for the next tick's audio

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
            voice: Voice | None
            if join.clip is not None:
                voice = engine.clip_voice(join.clip)
            else:
                voice = engine.voice() if join.voice is None else engine.voice(join.voice)
            engine.start(talk.slot, join.persona, voice, seed=join.seed)
            talk.voice = None if voice is None else voice.name
        except RequestError as error:
            return error
        except Exception as error:  # a fault of ours: logged; the client gets a line, not internals
            log.exception("a conversation could not start")
            return RequestError(f"the conversation could not start (a server fault: {type(error).__name__}); "
                                "try again")
        with self._condition:
            if not talk.closed:
                self._talks[talk.slot] = talk
        if talk.closed:  # the client left while its slot started
            engine.release(talk.slot)
        return None


def wait_s(talks: Iterable[Conversation], last_tick: float, now: float) -> float | None:
    """0 when a tick is due at `now` for these conversations (the last tick ran at `last_tick`);
    else how long to wait for one (None: until something arrives)."""
    talks = list(talks)
    listening = [t for t in talks if t.listening]
    prompting = len(listening) < len(talks)
    if listening and (all(t.frames for t in listening) or is_behind(listening)):
        return 0
    due = [t.waiting_since + TICK_GRACE_S for t in listening if t.waiting_since is not None]
    if prompting:
        due.append(last_tick + (TICK_GRACE_S if listening else 0))
    if not due:
        return None
    return max(0.0, min(due) - now)


def is_behind(talks: Iterable[Conversation]) -> bool:
    """A listening conversation has frames queued that arrived a tick apart or more: catch up."""
    return any(t.listening and len(t.arrived) > 1 and t.arrived[-1] - t.arrived[0] >= TICK_S for t in talks)


def deliver(calls: list[Call]) -> None:
    """A tick's callbacks to its conversations' sinks, on their event loop (those still open)."""
    for talk, fn, args in calls:
        if not talk.closed:
            try:
                fn(*args)
            except Exception:  # one socket's fault stays its own, as when each call was posted alone
                log.exception("a conversation's frame could not be handed to its socket")

"""A directing session on one socket: the handlers of voice, cast, lines, takes, keep/drop and notes.

Design choices:
- `Session` is the state of one socket (which session it holds, its queued or running take,
  its protocol error count); everything that outlives the socket is in the store. Each
  handler writes to the store first and then puts the announcing message in the outbox
  (backend/transport.py). The store is only called on the store thread
  (backend/store_thread.py): a handler's store work is one function run there and awaited
  (`stored_*`, `set_line`, `keep`, ...: they return the message to send), so a slow, frozen
  or full disk never holds up the event loop, and every other socket is still answered.
- A session has at most one active (queued or running) take; a newer take.start supersedes
  it. The active take's events come from the engine thread to its `LiveTake`
  (backend/directing/live_take.py), which stores and forwards them.
- A session resumed here while another replica still runs one of its takes (the director
  reconnected through the balancer before that replica noticed, or that replica died a moment
  ago) is watched: the store is polled every `WATCH_S` and the take's `take.done` comes to this
  socket when it ends there, or when that replica is found dead (finished as heard).
- The cast (backend/directing/cast.py) says who says each line and with which voice; a
  take's note and rating are the director's, stored as given; the length guard
  (backend/directing/length_guard.py) caps a take's frames by its line's length.
- The script is the server's: line.set / line.delete / line.order each answer with the whole
  script (`script`). So is the directing history (backend/directing/script.py): one kept
  take per line, and a take of a line with history "kept" hears the kept takes of the lines
  above it, in script order, so reordering the script reorders what the model hears.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
import traceback

from backend.directing import protocol as p
from backend.directing.cast import (
    cast_info,
    check_character,
    delete_member,
    encode_voice,
    history_turns,
    saved_voice,
    set_member,
    take_voice,
)
from backend.directing.jobs import PromptBuilder, TakeJob, TakeOutcome
from backend.directing.length_guard import guard_frames
from backend.directing.live_take import LiveTake, sampling_info
from backend.directing.loop import QueueFull
from backend.directing.scenes import DELETED
from backend.directing.script import kept_history
from backend.directing.warming import line_warm, next_line
from backend.state import ServerState
from backend.store import StoredTake, audio_url
from backend.transport import Outbox
from engine import Drama3Engine, Prompt, Sampling

log = logging.getLogger("retake.session")

WATCH_S = 0.5  # how often a take another replica runs is looked up in the store


class Session:
    """One directing socket."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.limits = state.settings.limits
        self.outbox: Outbox[p.ServerMessage] = Outbox(p.dump, state.settings.send_queue_frames)
        self.session_id: str | None = None
        self.active: LiveTake | None = None
        self.protocol_errors = 0
        self.watcher: asyncio.Task[None] | None = None  # takes of this session on another replica

    # Handlers that act as soon as a message arrives ------------------------------

    async def open(self, message: p.SessionOpen) -> None:
        state = self.state
        if self.session_id is not None:
            raise p.ProtocolError("session_already_open", f"this socket already holds session {self.session_id}")
        ready, elsewhere = await state.db.run(self.opened, message)
        session_id = ready.session_id
        previous = state.sessions.get(session_id)
        if previous is not None and previous is not self:
            previous.outbox.message(p.Error("session_taken_over", "this session was resumed on another "
                                            "connection", None, None, None))
            previous.outbox.close(1000, "session resumed on another connection")
            previous.detach()
        self.session_id = session_id
        state.sessions[session_id] = self
        self.outbox.message(ready)
        if elsewhere:
            self.watcher = asyncio.get_running_loop().create_task(self.watch(session_id, set(elsewhere)))

    def opened(self, message: p.SessionOpen) -> tuple[p.SessionReady, list[int]]:
        """(On the store thread.) The session made or resumed, as session.ready says it, and its
        takes that another replica runs."""
        store, state = self.state.store, self.state
        resumed = message.session_id is not None
        key: str | None = None  # sent in session.ready when the session gets one
        if message.session_id is not None:
            # A wrong key reads as an unknown session: neither says whether the id exists.
            known = store.session_key(message.session_id, message.session_key)
            if known == "unknown":
                raise p.ProtocolError("unknown_session", f"no session {message.session_id[:64]!r} with this "
                                                         "session_key is stored; open a new one without session_id")
            session_id = message.session_id
            if store.scene_deleted(session_id):
                raise p.ProtocolError("scene_deleted", DELETED)
            if known == "unclaimed":  # stored before sessions had keys: the first to resume it gets one
                key = store.new_session_key(session_id, unclaimed=True)
                if key is None:
                    raise p.ProtocolError("unknown_session", "another connection claimed this session first; "
                                                             "open it with its session_key")
            store.finish_orphaned_takes(session_id)  # a take its replica left when it died ends as heard
        else:
            session_id = store.create_session()
            key = store.new_session_key(session_id)
        voice, lines = store.session_voice(session_id), store.lines(session_id)
        kept = kept_history(store, session_id, lines)
        engine = state.engine
        ready = p.SessionReady(
            session_id=session_id, resumed=resumed, engine=engine.name, sample_rate=engine.sample_rate,
            frame_samples=engine.frame_samples, demo_weights=engine.demo_weights, limits=self.limits.to_json(),
            voice=None if voice is None else voice.info(), lines=lines,
            takes=[take.info() for take in store.takes(session_id)], history=kept.history, hears=kept.hears,
            cast=cast_info(store, session_id), name=store.scene_name(session_id), session_key=key, ref=message.ref)
        self.warm(session_id)  # a resumed scene's history into a cache a restart left cold
        return ready, store.takes_elsewhere(session_id)

    async def watch(self, session_id: str, pending: set[int]) -> None:
        """Send take.done for each of these takes (run by another replica) once it ends."""
        store = self.state.store
        while pending:
            await asyncio.sleep(WATCH_S)
            await self.state.db.run(store.finish_orphaned_takes, session_id)
            for take_id in sorted(pending):
                take = await self.state.db.run(store.take, session_id, take_id)
                if take is None or take.state != "done":
                    continue
                pending.discard(take_id)
                assert take.finish_reason is not None
                self.outbox.message(p.TakeDone(take.take_id, take.finish_reason, take.timings, take.frames,
                                               take.samples, take.attempts, audio_url(session_id, take_id),
                                               take.error))

    async def cancel(self, message: p.TakeCancel) -> None:
        session_id = self.require_open()
        if self.active is not None and self.active.take_id == message.take_id:
            self.active.cancel()  # at once: the store is asked only about other take ids
            return
        if await self.state.db.run(self.state.store.take, session_id, message.take_id) is None:
            raise p.ProtocolError("unknown_take", f"take {message.take_id} is not a take of this session",
                                  take_id=message.take_id)

    def supersede(self, reason: str | None = None) -> None:
        if self.active is not None:
            self.active.cancel(reason)

    def take_ended(self, take_id: int) -> None:
        if self.active is not None and self.active.take_id == take_id:
            self.active = None

    def idle(self) -> bool:
        return self.active is None

    def detach(self, reason: str | None = None) -> None:
        """The socket is closing (or its session moved): stop its take (an error saying `reason`,
        when the server dropped the socket), let go of the session."""
        self.supersede(reason)
        if self.watcher is not None:
            self.watcher.cancel()
        if self.session_id is not None and self.state.sessions.get(self.session_id) is self:
            del self.state.sessions[self.session_id]

    def require_open(self) -> str:
        if self.session_id is None:
            raise p.ProtocolError("session_not_open", 'send {"type": "session.open"} first')
        return self.session_id

    # Handlers run in message order ---------------------------------------------

    async def set_voice(self, message: p.VoiceSet) -> None:
        """The session's voice: the voice of a scene without a cast."""
        session_id = self.require_open()
        references = [(clip.audio, clip.text) for clip in message.references]
        character = message.character
        if message.saved_voice is not None:  # a copy of the saved voice: deleting it later changes nothing here
            references, character = await self.state.db.run(saved_voice, self.state.store, message.saved_voice,
                                                             "saved_voice")
        encoded = await encode_voice(self.state, references, character)
        stored = await self.state.db.run(self.state.store.set_voice, session_id, encoded, character)
        await self.state.db.run(self.warm, session_id)  # the new system message (asked before the reply)
        self.outbox.message(p.VoiceReady(None if stored is None else stored.info(), message.ref))

    # The cast and the notes ----------------------------------------------------

    async def set_cast(self, message: p.CastSet) -> None:
        session_id = self.require_open()
        members = await set_member(self.state, session_id, message)
        await self.state.db.run(self.warm, session_id)  # the cast is in every described character's prompt
        self.outbox.message(p.Cast(members, message.ref))

    # (delete_cast, note, set_line, delete_line, order_lines, keep, drop and stored_take run on the
    # store thread: `dispatch` awaits them there and puts what they return in the outbox.)

    def delete_cast(self, message: p.CastDelete) -> list[p.ServerMessage]:
        session_id = self.require_open()
        delete_member(self.state.store, session_id, message.character_id)
        return [p.Cast(cast_info(self.state.store, session_id), message.ref),
                self.script(session_id, None)]  # its lines went back to the first character

    def note(self, message: p.TakeNote) -> p.TakeNoted:
        session_id = self.require_open()
        if self.state.store.take(session_id, message.take_id) is None:
            raise p.ProtocolError("unknown_take", f"take {message.take_id} is not a take of this session",
                                  take_id=message.take_id)
        note, rating = self.state.store.set_note(message.take_id, message.note, message.rating)
        return p.TakeNoted(message.take_id, note, rating, message.ref)

    # The script -----------------------------------------------------------------

    def script(self, session_id: str, ref: str | None) -> p.Script:
        lines = self.state.store.lines(session_id)
        kept = kept_history(self.state.store, session_id, lines)
        return p.Script(lines, kept.history, kept.hears, ref)

    def check_new_line(self, line_id: str, script: list[str]) -> None:
        limit = self.limits.max_lines_per_session
        if line_id not in script and len(script) >= limit:
            raise p.ProtocolError("too_many_lines", f"the script holds {limit} lines, the most it may; delete "
                                                    "a line first")

    def set_line(self, message: p.LineSet) -> p.Script:
        session_id = self.require_open()
        store = self.state.store
        script = store.line_ids(session_id)
        self.check_new_line(message.line_id, script)
        if message.after is not None and message.after not in script:
            raise p.ProtocolError("unknown_line", f"after: {message.after[:64]!r} is not a line of the script")
        if message.cast:
            check_character(store, session_id, message.character_id)
        store.set_line(session_id, message.line_id, message.text, after=message.after, place=message.place)
        if message.cast:
            store.set_line_character(session_id, message.line_id, message.character_id)
        self.warm(session_id, written=message.line_id)
        return self.script(session_id, message.ref)

    def delete_line(self, message: p.LineDelete) -> p.Script:
        session_id = self.require_open()
        if message.line_id not in self.state.store.line_ids(session_id):
            raise p.ProtocolError("unknown_line", f"{message.line_id[:64]!r} is not a line of the script")
        self.state.store.delete_line(session_id, message.line_id)
        return self.script(session_id, message.ref)

    def order_lines(self, message: p.LineOrder) -> p.Script:
        session_id = self.require_open()
        script = self.state.store.line_ids(session_id)
        unknown = [line_id for line_id in message.line_ids if line_id not in script]
        if unknown:
            raise p.ProtocolError("unknown_line", f"line_ids: {unknown[0][:64]!r} is not a line of the script")
        missing = [line_id for line_id in script if line_id not in message.line_ids]
        if missing:
            named = ", ".join(repr(line_id[:64]) for line_id in missing[:3]) + (" ..." if len(missing) > 3 else "")
            raise p.ProtocolError("bad_field", f"line_ids must list every line of the script once; missing {named}")
        self.state.store.set_order(session_id, list(message.line_ids))
        return self.script(session_id, message.ref)

    # Takes ----------------------------------------------------------------------

    def usable_take(self, session_id: str, take_id: int, found: dict[int, StoredTake] | None = None) -> StoredTake:
        """The take, checked: this session's, finished, with audio (`found`: takes read already)."""
        take = self.state.store.take(session_id, take_id) if found is None else found.get(take_id)
        if take is None:
            raise p.ProtocolError("unknown_take", f"take {take_id} is not a take of this session", take_id=take_id)
        if take.state != "done":
            raise p.ProtocolError("take_not_finished", f"take {take_id} is still {take.state}; wait for its "
                                                       "take.done", take_id=take_id)
        if not take.usable:
            raise p.ProtocolError("take_not_usable", f"take {take_id} has no audio ({take.finish_reason}, "
                                                     f"{take.frames} frames)", take_id=take_id)
        return take

    async def start_take(self, message: p.TakeStart) -> None:
        session_id = self.require_open()
        state, limits = self.state, self.limits
        if state.draining:
            raise p.ProtocolError("draining", "this replica is draining (restarting): reconnect, and start the "
                                              "take again on the replica you reach")
        self.supersede()
        try:
            state.engine_loop.check_room(limits.max_queue)  # before the take is stored: a busy take is only an error
        except QueueFull as error:
            raise p.ProtocolError("busy", str(error), retry_after_ms=error.retry_after_ms) from None
        received = time.monotonic()
        take, history_ids, build_prompt, sampling = await state.db.run(self.stored_take, message)
        deadline_ms = message.deadline_ms or limits.default_deadline_ms
        live = LiveTake(state, self, take, history_ids)
        loop = asyncio.get_running_loop()
        guard = state.settings.silence if state.settings.silence.retries > 0 else None
        live.job = TakeJob(build_prompt, sampling, live, loop, received + deadline_ms / 1000, guard,
                           chars=len(message.text))
        try:
            position = state.engine_loop.submit(live.job)
        except QueueFull as error:  # only while the server stops
            live.done(TakeOutcome("error", {"queue_ms": 0}, None, 0, 0, str(error)))
            return
        self.active = live
        live.timer = loop.call_at(loop.time() + deadline_ms / 1000, live.expire)
        self.outbox.message(p.TakeQueued(take.take_id, take.line_id, position, deadline_ms,
                                         audio_url(session_id, take.take_id), take.voice_id, take.sampling,
                                         take.character_id, take.guard_frames, message.ref))

    def stored_take(self, message: p.TakeStart) -> tuple[StoredTake, list[int], PromptBuilder, Sampling]:
        """`checked_take` (its checks: a dozen reads; its insert) as one store transaction."""
        with self.state.store.together():
            return self.checked_take(message)

    def checked_take(self, message: p.TakeStart) -> tuple[StoredTake, list[int], PromptBuilder, Sampling]:
        """The take checked against the session and stored (queued), with what its job needs: the
        history it asks for, its prompt builder and its settings (the seed picked)."""
        session_id = self.require_open()
        state, store, limits = self.state, self.state.store, self.limits
        # The takes it hears in one query, however long the scene (a query each cost a director
        # ~0.3 ms per kept take before take.queued, on 2 CPU cores).
        if message.history == "kept":
            history_ids = store.kept_history(session_id, message.line_id)  # the lines above this one
            found = store.takes_by_id(session_id, history_ids)
        else:
            found = store.takes_by_id(session_id, list(message.history))
            history_ids = [self.usable_take(session_id, take_id, found).take_id for take_id in message.history]
        if store.count_takes(session_id) >= limits.max_takes_per_session:
            raise p.ProtocolError("too_many_takes", f"this session holds {limits.max_takes_per_session} takes, "
                                                    "the most it may; open a new session")
        self.check_new_line(message.line_id, store.line_ids(session_id))
        sampling = message.sampling  # checked, with the engine's defaults, by parse
        if sampling.seed is None:  # the server picks the seed and stores it: every take can be reproduced
            sampling = dataclasses.replace(sampling, seed=secrets.randbelow(2**31))
        capped: int | None = None  # the length guard's cap, when it is below the take's max_new_tokens
        if message.length_guard:
            engine = state.engine
            cap = guard_frames(message.text, engine.sample_rate / engine.frame_samples, sampling.max_new_tokens)
            if cap < sampling.max_new_tokens:
                capped, sampling = cap, dataclasses.replace(sampling, max_new_tokens=cap)
        member, voice, engine_voice_value = take_voice(store, session_id, message.line_id)
        heard = [found[take_id] for take_id in history_ids if take_id in found]
        turns = history_turns(store, session_id, heard, engine_voice_value)
        text, max_rows = message.text, limits.max_prompt_rows

        def build_prompt(engine: Drama3Engine, attempt_sampling: Sampling) -> Prompt:
            return engine.prompt(text, engine_voice_value, turns, attempt_sampling, drop_oldest_history=True,
                                 max_rows=max_rows)

        take = store.add_take(session_id, message.line_id, message.text, None if voice is None else voice.voice_id,
                              sampling_info(sampling), character_id=None if member is None else member.character_id,
                              guard_frames=capped)
        return take, history_ids, build_prompt, sampling

    def keep(self, message: p.TakeKeep) -> p.History:
        """Keep the take: it replaces its line's kept take, if any (`unkept`); the next line's
        prompt goes into the prefix cache while the director reads (directing/warming.py)."""
        session_id = self.require_open()
        take = self.usable_take(session_id, message.take_id)
        unkept = self.state.store.keep(take.take_id)
        kept = kept_history(self.state.store, session_id)
        self.warm(session_id, take.line_id)
        return p.History(kept.history, [], None, kept.hears, unkept)

    def warm(self, session_id: str, after: str | None = None, written: str | None = None) -> None:
        """(On the store thread.) Ask the engine to prefill the prompt of the line the director most
        likely takes next (the one after `after`; else the first with no kept take) into the prefix
        cache while they read (directing/warming.py); nothing when the cache is off. `written`: a
        line just written or edited, warmed only if it is that line."""
        loop, store = self.state.engine_loop, self.state.store
        if (engine := loop.engine) is None or engine.prefix_cache_stats() is None:
            return
        try:
            line_id = next_line(store, session_id, after)
            if written is not None and line_id != written:
                return
            loop.warm(session_id, line_warm(store, session_id, line_id, self.limits.max_prompt_rows))
        except Exception:  # noqa: BLE001 - a warm is an optimisation: never a reason to refuse what asked for it
            log.warning("could not warm the prefix cache for session %s:\n%s", session_id[:8], traceback.format_exc())

    def drop(self, message: p.TakeDrop) -> p.History:
        session_id = self.require_open()
        if self.state.store.take(session_id, message.take_id) is None:
            raise p.ProtocolError("unknown_take", f"take {message.take_id} is not a take of this session",
                                  take_id=message.take_id)
        self.state.store.set_kept(message.take_id, False)
        kept = kept_history(self.state.store, session_id)
        return p.History(kept.history, [], None, kept.hears)

    async def handle(self, message: p.ClientMessage) -> None:
        """An in-order message (everything but session.open, take.cancel and ping); the scene's
        last change is now."""
        await self.dispatch(message)
        if self.session_id is not None:
            await self.state.db.run(self.state.store.touch, self.session_id)

    async def dispatch(self, message: p.ClientMessage) -> None:
        run = self.state.db.run
        match message:
            case p.VoiceSet():
                await self.set_voice(message)
            case p.LineSet():
                self.outbox.message(await run(self.set_line, message))
            case p.LineDelete():
                self.outbox.message(await run(self.delete_line, message))
            case p.LineOrder():
                self.outbox.message(await run(self.order_lines, message))
            case p.TakeStart():
                await self.start_take(message)
            case p.TakeKeep():
                self.outbox.message(await run(self.keep, message))
            case p.TakeDrop():
                self.outbox.message(await run(self.drop, message))
            case p.CastSet():
                await self.set_cast(message)
            case p.CastDelete():
                for reply in await run(self.delete_cast, message):
                    self.outbox.message(reply)
            case p.TakeNote():
                self.outbox.message(await run(self.note, message))
            case _:
                raise AssertionError(f"{message.type} is handled on arrival")


"""A scene's cast: its characters, each with a voice, each line said by one of them, and what a
take's prompt is made of (the voice of its line's character and the scene's history).

Design choices:
- A character's voice is checked exactly as `voice.set` checks the session's: the clips are
  encoded and a prompt is laid out with it on the engine thread before anything is stored, so a
  cast member always has a voice a take can use.
- A saved voice (§8.1, shared with the speech API's `voice`) joins a cast as a copy of its clips
  or its description (under the cast member's name), as `voice.set` takes one.
- A line without a character of its own is said by the scene's first character; a scene
  without a cast speaks with the session's voice (`voice.set`), as a single-voice scene
  always did.
- The prompt follows the Drama 3 layouts (engine/drama3/prompt.py): a described character's
  take lists every described character of the cast and hears each kept take as said by its own
  character (`name: text`); a character with reference clips has the one-speaker reference
  layout, where every turn of the history is speaker 0's.
"""

from __future__ import annotations

import numpy as np

from backend.clips import checked_clip
from backend.directing import protocol as p
from backend.directing.loop import QueueFull
from backend.state import ServerState
from backend.store import CastMember, Store, StoredReference, StoredTake, StoredVoice
from engine import Character, Drama3Engine, HistoryTurn, Reference, RequestError, Sampling

EngineVoice = list[Reference] | Character | None


def engine_voice(voice: StoredVoice | None) -> EngineVoice:
    if voice is None:
        return None
    if voice.character is not None:
        c = voice.character
        return Character(name=c.name, description=c.description, scene=c.scene)
    return [Reference(codes=r.codes, transcript=r.text) for r in voice.references]


async def encode_voice(state: ServerState, references: list[tuple[bytes, str]],
                       character: p.CharacterSpec | None, path: str = "") -> list[StoredReference]:
    """Encode the clips and check the voice the way a take will use it (ProtocolError when it cannot).

    Each clip is checked off the loop first (backend/clips.py: its header, then decoded in blocks
    up to the limit), so the engine thread only ever decodes a bounded mono clip."""
    checked = []
    for index, (audio, text) in enumerate(references):
        try:
            clean, _seconds = await checked_clip(audio, state.settings.limits.max_reference_seconds,
                                                 f"{path}references.{index}.audio")
        except RequestError as error:
            raise p.ProtocolError("bad_reference", str(error)) from None
        checked.append((clean, text))

    def encode(engine: Drama3Engine) -> list[np.ndarray]:
        codes = []
        for index, (audio, _text) in enumerate(checked):
            try:
                codes.append(engine.encode_reference(audio))
            except RequestError as error:
                raise RequestError(f"{path}references.{index}: {error}") from None
        voice: EngineVoice = (
            Character(character.name, character.description, character.scene) if character
            else [Reference(codes=c, transcript=t) for c, (_a, t) in zip(codes, references)] or None)
        engine.prompt("Check.", voice, [], Sampling(max_new_tokens=1, seed=0))
        return codes

    try:
        codes = await state.call(encode)
    except QueueFull as error:
        raise p.ProtocolError("busy", str(error), retry_after_ms=error.retry_after_ms) from None
    except RequestError as error:
        raise p.ProtocolError("bad_reference" if references else "bad_field", str(error)) from None
    return [StoredReference(text, c) for (_a, text), c in zip(references, codes)]


def cast_info(store: Store, session_id: str) -> list[p.CastInfo]:
    return [{"character_id": m.character_id, "name": m.name, "position": m.position,
             "voice": None if m.voice_id is None else store.voice(m.voice_id).info()}
            for m in store.cast(session_id)]


async def set_member(state: ServerState, session_id: str, message: p.CastSet) -> list[p.CastInfo]:
    """Add or rename a cast member; with a voice, encode and store it first. The cast after it.
    (The store is called on the store thread, the clips encoded on the engine's.)"""
    store, limits = state.store, state.settings.limits
    voice = message.voice

    def check() -> tuple[list[tuple[bytes, str]], p.CharacterSpec | None]:
        """The checks, and the voice's clips and character (a saved voice's, when it names one)."""
        cast = store.cast(session_id)
        if message.character_id not in {m.character_id for m in cast} and len(cast) >= limits.max_cast:
            raise p.ProtocolError("too_many_characters", f"the cast holds {limits.max_cast} characters, the most "
                                                         "a scene may; remove one first")
        if any(m.name == message.name and m.character_id != message.character_id for m in cast):
            raise p.ProtocolError("bad_field", f"name: the cast has a character called {message.name!r} already")
        if voice is None:
            return [], None
        character = (None if voice.description is None else
                     p.CharacterSpec(message.name, voice.description, voice.scene))
        clips = [(clip.audio, clip.text) for clip in voice.references]
        if voice.saved_voice is not None:  # a copy, under the cast member's name: deleting it later changes nothing
            clips, saved = saved_voice(store, voice.saved_voice, "voice.saved_voice")
            character = None if saved is None else p.CharacterSpec(message.name, saved.description, saved.scene)
        return clips, character

    clips, character = await state.db.run(check)
    references = [] if voice is None else await encode_voice(state, clips, character, "voice.")

    def write() -> list[p.CastInfo]:
        if voice is None:
            store.set_cast_member(session_id, message.character_id, message.name)
        else:
            stored = store.add_voice(session_id, references, character) if references or character else None
            store.set_cast_member(session_id, message.character_id, message.name,
                                  None if stored is None else stored.voice_id)
        return cast_info(store, session_id)

    return await state.db.run(write)


def saved_voice(store: Store, key: str, field: str) -> tuple[list[tuple[bytes, str]], p.CharacterSpec | None]:
    """A saved voice's clips and character, by its name or id (`bad_field` naming the saved ones)."""
    saved = store.saved_voice(key)
    if saved is None:
        names = ", ".join(voice.name for voice in store.saved_voices()) or "none yet"
        raise p.ProtocolError("bad_field", f"{field}: unknown voice {key!r}; the saved voices are {names}")
    return saved.clips, saved.character


def delete_member(store: Store, session_id: str, character_id: str) -> None:
    if character_id not in {m.character_id for m in store.cast(session_id)}:
        raise p.ProtocolError("unknown_character", f"{character_id[:64]!r} is not a character of the cast")
    store.delete_cast_member(session_id, character_id)


def check_character(store: Store, session_id: str, character_id: str | None) -> None:
    if character_id is not None and character_id not in {m.character_id for m in store.cast(session_id)}:
        raise p.ProtocolError("unknown_character", f"character_id: {character_id[:64]!r} is not a character of "
                              "the cast; add it with cast.set first")


def take_voice(store: Store, session_id: str,
               line_id: str) -> tuple[CastMember | None, StoredVoice | None, EngineVoice]:
    """Who says a take of the line (None without a cast), its stored voice, and the voice the
    engine is given: a described character with the whole described cast, references, or none."""
    member = store.line_character(session_id, line_id)
    if member is None:
        voice = store.session_voice(session_id)
        return None, voice, engine_voice(voice)
    voice = None if member.voice_id is None else store.voice(member.voice_id)
    if voice is None or voice.character is None:
        return member, voice, engine_voice(voice)
    described = []
    for other in store.cast(session_id):
        spec = None if other.voice_id is None else store.voice(other.voice_id).character
        if spec is not None:
            described.append(Character(other.name, spec.description))
    return member, voice, Character(member.name, voice.character.description, voice.character.scene,
                                    tuple(described))


def history_turns(store: Store, session_id: str, history: list[StoredTake], voice: EngineVoice) -> list[HistoryTurn]:
    """The kept takes a take hears, as turns: in a described character's prompt each is said by the
    character it was a take of (a take from before the cast, by the take's own character)."""
    described = isinstance(voice, Character)
    names = {m.character_id: m.name for m in store.cast(session_id)} if described else {}
    found = store.takes_codes([take.take_id for take in history])  # one query for the scene, not one a take
    turns = []
    for take in history:
        codes = found.get(take.take_id)
        if codes is None:
            continue
        speaker = names.get(take.character_id or "") if described else None
        turns.append(HistoryTurn(text=take.text, codes=codes, speaker=speaker))
    return turns

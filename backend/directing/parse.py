"""Client text frames into typed messages (backend/directing/protocol/), checked field by field.

Design choices:
- Parsed by hand, no schema library: each check names the field and says what to change,
  and raises `ProtocolError(code, message)` with the client's `ref` attached.
- Unknown fields are ignored, so newer clients keep working with older servers.
- JSON has one number type: 3.0 is accepted where an integer is asked for, 3.5 and true
  are not.
- take.start's `sampling` is checked by the engine's `Sampling.from_fields` (the one check
  of sampling settings, with the engine's defaults); its message becomes `bad_field`.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Literal, TypeAlias

from backend import json_input
from backend.directing.protocol import (
    CastDelete,
    CastSet,
    CastVoice,
    CharacterSpec,
    ClientMessage,
    Limits,
    LineDelete,
    LineOrder,
    LineSet,
    Ping,
    ProtocolError,
    ReferenceClip,
    SessionOpen,
    TakeCancel,
    TakeDrop,
    TakeKeep,
    TakeNote,
    TakeStart,
    VoiceSet,
)
from engine import RequestError, Sampling

JsonObject: TypeAlias = dict[str, object]


def _bad(name: str, what: str) -> ProtocolError:
    return ProtocolError("bad_field", f"{name} must be {what}")


def _string(obj: JsonObject, name: str, max_chars: int, *, required: bool = True, path: str = "") -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _bad(path + name, "a non-empty string")
    if len(value) > max_chars:
        raise _bad(path + name, f"at most {max_chars} characters (got {len(value)})")
    return value


def _integer(obj: JsonObject, name: str, low: int, high: int, *, required: bool = True,
             path: str = "") -> int | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    # JSON has one number type: 3.0 is accepted as 3, 3.5 and true are not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(path + name, "an integer")
    if not low <= value <= high:
        raise _bad(path + name, f"between {low} and {high} (got {value})")
    return value


def _number(obj: JsonObject, name: str, low: float, high: float, *, low_open: bool = False,
            path: str = "") -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite(value):
        raise _bad(path + name, "a finite number")
    if value < low or value > high or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise _bad(path + name, f"in {interval} (got {value:g})")
    return float(value)


def finite(value: int | float) -> bool:
    """Whether a JSON number is finite as a float (an integer of 400 digits is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _object(obj: JsonObject, name: str, path: str = "") -> JsonObject | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(path + name, "an object")
    return value


def _take_id(obj: JsonObject) -> int:
    take_id = _integer(obj, "take_id", 1, 2**32 - 1)
    assert take_id is not None
    return take_id


def _line_ids(value: object, limits: Limits) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _bad("line_ids", "a list of line ids")
    if len(value) > limits.max_lines_per_session:
        raise _bad("line_ids", f"at most {limits.max_lines_per_session} line ids")
    ids: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or len(item) > limits.max_id_chars:
            raise _bad(f"line_ids.{index}",
                       f"a line id (a non-empty string of at most {limits.max_id_chars} characters)")
        ids.append(item)
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise _bad("line_ids", f"a list of distinct line ids ({twice[:64]!r} is there twice)")
    return tuple(ids)


def _line_set(obj: JsonObject, limits: Limits, ref: str | None) -> LineSet:
    line_id = _string(obj, "line_id", limits.max_id_chars)
    assert line_id is not None
    text = obj.get("text")
    if not isinstance(text, str):
        raise _bad("text", "a string (empty for a line not written yet)")
    if len(text) > limits.max_text_chars:
        raise _bad("text", f"at most {limits.max_text_chars} characters (got {len(text)})")
    place = "after" in obj
    after = _string(obj, "after", limits.max_id_chars, required=False) if place else None
    if after == line_id:
        raise _bad("after", "another line's id (a line cannot follow itself)")
    cast = "character_id" in obj
    character_id = _string(obj, "character_id", limits.max_id_chars, required=False) if cast else None
    return LineSet(line_id, text, after, place, ref, character_id, cast)


def _sampling(obj: JsonObject | None, limits: Limits) -> Sampling:
    """The engine's settings: the client's fields over its defaults, checked by the engine."""
    try:
        return Sampling.from_fields(obj or {}, where="sampling.", max_new_tokens=limits.max_new_tokens)
    except RequestError as error:
        raise ProtocolError("bad_field", str(error)) from None


def _history(value: object, limits: Limits) -> Literal["kept"] | tuple[int, ...]:
    if value is None or value == "kept":
        return "kept"
    if not isinstance(value, list):
        raise _bad("history", '"kept" or a list of take ids')
    if len(value) > limits.max_takes_per_session:
        raise _bad("history", f"at most {limits.max_takes_per_session} take ids")
    ids = []
    for index, item in enumerate(value):
        if isinstance(item, float) and item.is_integer():
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item < 2**32:
            raise _bad(f"history.{index}", "a take id (a positive integer)")
        ids.append(item)
    return tuple(ids)


def _clips(raw_references: object, limits: Limits, path: str = "") -> tuple[ReferenceClip, ...]:
    """Reference clips: a list of {audio: base64 WAV or FLAC, text: transcript}."""
    if raw_references is not None and not isinstance(raw_references, list):
        raise _bad(path + "references", "a list of {audio, text} objects")
    references = raw_references or []
    if len(references) > limits.max_references:
        raise _bad(path + "references", f"at most {limits.max_references} clips (got {len(references)})")
    clips = []
    for index, item in enumerate(references):
        path = f"{path}references.{index}."
        if not isinstance(item, dict):
            raise _bad(f"references.{index}", "an object {audio, text}")
        encoded = _string(item, "audio", 2 * limits.max_reference_bytes, path=path)
        text = _string(item, "text", limits.max_text_chars, path=path)
        assert encoded is not None and text is not None
        try:
            audio = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(path + "audio", "base64 of a WAV or FLAC file") from None
        if len(audio) > limits.max_reference_bytes:
            raise _bad(path + "audio", f"at most {limits.max_reference_bytes} bytes (got {len(audio)})")
        clips.append(ReferenceClip(audio, text))
    return tuple(clips)


def _voice(obj: JsonObject, limits: Limits, ref: str | None) -> VoiceSet:
    character = _object(obj, "character")
    clips = _clips(obj.get("references"), limits)
    if clips and character is not None:
        raise ProtocolError("bad_field", "give either references or a character, not both")
    saved_voice = _string(obj, "saved_voice", limits.max_id_chars, required=False)
    if saved_voice is not None and (clips or character is not None):
        raise ProtocolError("bad_field", "give a saved_voice alone: it is the voice's clips or character")
    spec = None
    if character is not None:
        name = _string(character, "name", limits.max_id_chars, path="character.")
        description = _string(character, "description", limits.max_text_chars, path="character.")
        scene = _string(character, "scene", limits.max_text_chars, required=False, path="character.")
        assert name is not None and description is not None
        spec = CharacterSpec(name, description, scene)
    return VoiceSet(clips, spec, ref, saved_voice)


def _cast_set(obj: JsonObject, limits: Limits, ref: str | None) -> CastSet:
    character_id = _string(obj, "character_id", limits.max_id_chars)
    name = _string(obj, "name", limits.max_name_chars)
    assert character_id is not None and name is not None
    if ":" in name or "\n" in name:
        raise _bad("name", "a single line without ':' (the script writes 'name: line')")
    raw = _object(obj, "voice")
    if raw is None:
        return CastSet(character_id, name.strip(), None, ref)
    clips = _clips(raw.get("references"), limits, "voice.")
    description = _string(raw, "description", limits.max_text_chars, required=False, path="voice.")
    scene = _string(raw, "scene", limits.max_text_chars, required=False, path="voice.")
    saved_voice = _string(raw, "saved_voice", limits.max_id_chars, required=False, path="voice.")
    if clips and description is not None:
        raise ProtocolError("bad_field", "voice: give either references or a description, not both")
    if saved_voice is not None and (clips or description is not None):
        raise ProtocolError("bad_field", "voice: give a saved_voice alone: it is the voice's clips or description")
    if scene is not None and description is None:
        raise _bad("voice.scene", "given with a description (a scene sets a described character)")
    return CastSet(character_id, name.strip(), CastVoice(clips, description, scene, saved_voice), ref)


def _take_note(obj: JsonObject, limits: Limits, ref: str | None) -> TakeNote:
    note = obj.get("note")
    if note is not None and not isinstance(note, str):
        raise _bad("note", "a string (empty to clear it)")
    if note is not None and len(note) > limits.max_note_chars:
        raise _bad("note", f"at most {limits.max_note_chars} characters (got {len(note)})")
    rating = _integer(obj, "rating", 0, 5, required=False)
    if note is None and rating is None:
        raise ProtocolError("bad_field", "give a note, a rating (1 to 5, 0 clears it), or both")
    return TakeNote(_take_id(obj), note, rating, ref)


def parse_client_message(text: str | bytes, limits: Limits) -> ClientMessage:
    """A client text frame as a typed message, or ProtocolError with a code and what to change."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_message_bytes:
        raise ProtocolError("message_too_big", f"messages are limited to {limits.max_message_bytes} bytes "
                                               f"(got {size})")
    try:
        obj = json_input.loads(text)
    except ValueError as error:
        raise ProtocolError("bad_json", f"not valid JSON: {error}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_json", "a message must be a JSON object with a type")
    ref = obj.get("ref")
    if ref is not None and (not isinstance(ref, str) or len(ref) > limits.max_id_chars):
        raise _bad("ref", f"a string of at most {limits.max_id_chars} characters")
    try:
        return _parse(obj, limits, ref)
    except ProtocolError as error:
        error.ref = ref  # echoed so the client knows which of its messages failed
        raise


def _parse(obj: JsonObject, limits: Limits, ref: str | None) -> ClientMessage:
    kind = obj.get("type")
    if kind == "session.open":
        return SessionOpen(_string(obj, "session_id", limits.max_id_chars, required=False),
                           _string(obj, "session_key", limits.max_id_chars, required=False), ref)
    if kind == "voice.set":
        return _voice(obj, limits, ref)
    if kind == "line.set":
        return _line_set(obj, limits, ref)
    if kind == "line.delete":
        line_id = _string(obj, "line_id", limits.max_id_chars)
        assert line_id is not None
        return LineDelete(line_id, ref)
    if kind == "line.order":
        return LineOrder(_line_ids(obj.get("line_ids"), limits), ref)
    if kind == "take.start":
        line_id = _string(obj, "line_id", limits.max_id_chars)
        text = _string(obj, "text", limits.max_text_chars)
        assert line_id is not None and text is not None
        deadline_ms = _integer(obj, "deadline_ms", 1, limits.max_deadline_ms, required=False)
        guard = obj.get("length_guard", True)
        if not isinstance(guard, bool):
            raise _bad("length_guard", "true or false")
        return TakeStart(line_id, text, _sampling(_object(obj, "sampling"), limits),
                         _history(obj.get("history"), limits), deadline_ms, ref, guard)
    if kind == "take.cancel":
        return TakeCancel(_take_id(obj), ref)
    if kind == "take.keep":
        return TakeKeep(_take_id(obj), ref)
    if kind == "take.drop":
        return TakeDrop(_take_id(obj), ref)
    if kind == "cast.set":
        return _cast_set(obj, limits, ref)
    if kind == "cast.delete":
        character_id = _string(obj, "character_id", limits.max_id_chars)
        assert character_id is not None
        return CastDelete(character_id, ref)
    if kind == "take.note":
        return _take_note(obj, limits, ref)
    if kind == "ping":
        return Ping(_number(obj, "t", -1e300, 1e300), ref)
    if not isinstance(kind, str):
        raise ProtocolError("unknown_type", "a message needs a string type, such as \"take.start\"")
    raise ProtocolError("unknown_type", f"unknown message type {kind[:64]!r}")

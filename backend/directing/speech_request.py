"""The `/v1/audio/speech` request body of the seed, parsed into one `SpeechRequest`.

Body fields: `input` (the text, or the `@@drama3-space@@` envelope), `references`
(`[{data | base64: base64 WAV/FLAC, text}]`), `temperature`, `top_p`, `top_k`,
`max_new_tokens` and, beyond the seed, `seed`. Other fields (model, voice,
response_format, stream, ...) belong to the HTTP layer and are ignored here.

The envelope is `@@drama3-space@@` followed by a JSON object:
`{"text", "history": [earlier line, ...], "voice_references": n, "character": {name,
description, scene?}}`. `references` then holds the n voice clips first and one clip
per history turn after them, oldest first.

Design choices:
- The rules are the seed's (which are sglang-omni's plus the envelope's); each has a
  `RequestError` whose message says what to change. Where the seed would crash on a
  malformed body (a reference that is not an object, bad base64) this refuses it.
- It lives in the backend because it is HTTP: the engine knows takes (`engine.prompt`), not
  request bodies. Base64 is decoded here, so a `SpeechRequest` holds audio bytes; the
  speech handler (backend/directing/speech.py) has the engine encode them
  (`engine.encode_reference`, cached) and lay out the prompt (`engine.prompt`).
- As in the seed, `max_new_tokens` of 0 or null means the cap.
- Sizes are checked before anything reads what they measure: `input` and every text against
  `limits.max_text_chars`, clip counts, and each clip's base64 against
  `limits.max_reference_bytes`. The clips' audio is checked afterwards, off the event loop
  (backend/clips.py, in the speech handler).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend import json_input
from backend.directing.protocol import Limits
from engine import Character, RequestError, Sampling, check_text, checked_character
from engine.drama3.sampling import FIELDS as SAMPLING_FIELDS
from engine.drama3.sampling import MAX_NEW_TOKENS

ENVELOPE_MARKER = "@@drama3-space@@"
MAX_HISTORY_TURNS = 32  # earlier lines with their clips in one envelope


@dataclass(frozen=True)
class Clip:
    """Encoded audio (WAV/FLAC bytes) and the text spoken in it."""

    audio: bytes
    text: str


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    references: list[Clip]  # the voice, or empty
    history: list[Clip]  # earlier takes, oldest first
    character: Character | None
    sampling: Sampling


def _sampling(body: Mapping[str, Any], cap: int) -> Sampling:
    """The body's sampling fields through the engine's one check (its defaults for the rest).
    As in the seed, a max_new_tokens of 0 or null means the cap, and more than the cap is the cap
    (the server's `limits.max_new_tokens`, at most the engine's)."""
    fields = {name: body.get(name) for name in SAMPLING_FIELDS}
    n = fields["max_new_tokens"]
    if not n or (isinstance(n, int) and not isinstance(n, bool) and n > cap):
        fields["max_new_tokens"] = cap
    return Sampling.from_fields(fields)


def _length(value: object, name: str, limit: int) -> None:
    """Refuse a string past `limit` characters before anything reads it (tokenizing 50 MB would
    hold the engine thread for minutes)."""
    if isinstance(value, str) and len(value) > limit:
        raise RequestError(f"{name} is {len(value)} characters; the limit is {limit}")


def _audio(reference: Mapping[str, Any], location: str, limits: Limits) -> bytes:
    data = reference.get("data") or reference.get("base64")
    if not isinstance(data, str):
        raise RequestError(f"{location} needs its audio as a base64 string in 'data'")
    if len(data) > 4 * (limits.max_reference_bytes + 2) // 3:
        raise RequestError(f"{location}.data holds more than {limits.max_reference_bytes} bytes of audio; send a "
                           "shorter clip")
    try:
        audio = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise RequestError(f"{location}.data is not valid base64 ({error})") from error
    if not audio:
        raise RequestError(f"{location}.data is empty; give a WAV or FLAC clip")
    return audio


def _references(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    references = body.get("references") or []
    if not isinstance(references, list) or not all(isinstance(r, Mapping) for r in references):
        raise RequestError("references must be a list of objects {data: base64 audio, text: transcript}")
    return references  # JSON objects: values of any JSON type, each checked where it is read


def parse_speech_request(body: object, limits: Limits | None = None) -> SpeechRequest:
    """Check a `/v1/audio/speech` body (a parsed JSON object) as the seed does, and against the
    server's limits (text lengths, clip counts and sizes) before anything reads it."""
    limits = limits or Limits()
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    text = body.get("input")
    if not isinstance(text, str):
        raise RequestError("input must be a string: the text to speak")
    references = _references(body)
    if len(references) > limits.max_references + MAX_HISTORY_TURNS:
        raise RequestError(f"references holds {len(references)} clips; the limit is {limits.max_references} voice "
                           f"clips and {MAX_HISTORY_TURNS} history turns")
    for i, r in enumerate(references):
        _length(r.get("text"), f"references.{i}.text", limits.max_text_chars)
    sampling = _sampling(body, min(limits.max_new_tokens, MAX_NEW_TOKENS))

    if not text.startswith(ENVELOPE_MARKER):
        _length(text, "input", limits.max_text_chars)
        check_text(text, "input")
        if len(references) > limits.max_references:
            raise RequestError(f"references holds {len(references)} clips; the limit is {limits.max_references}")
        voice = [Clip(_audio(r, f"references.{i}", limits),
                      check_text(r.get("text") or "", f"references.{i}.text"))
                 for i, r in enumerate(references)]
        return SpeechRequest(text=text, references=voice, history=[], character=None, sampling=sampling)

    try:
        envelope = json_input.loads(text[len(ENVELOPE_MARKER):])
    except ValueError as error:
        raise RequestError(f"malformed envelope after {ENVELOPE_MARKER}: {error}") from error
    if not isinstance(envelope, Mapping):
        raise RequestError(f"the envelope after {ENVELOPE_MARKER} must be a JSON object")
    _length(envelope.get("text"), "text", limits.max_text_chars)
    line = check_text(envelope.get("text"), "text")
    history = envelope.get("history") or []
    if not isinstance(history, list) or not all(isinstance(turn, str) for turn in history):
        raise RequestError("envelope history must be a list of strings (the earlier lines, oldest first)")
    if len(history) > MAX_HISTORY_TURNS:
        raise RequestError(f"history holds {len(history)} turns; the limit is {MAX_HISTORY_TURNS}")
    for i, turn in enumerate(history):
        _length(turn, f"history.{i}", limits.max_text_chars)
    history = [check_text(turn, f"history.{i}") for i, turn in enumerate(history)]
    voice_count = envelope.get("voice_references", 0)
    if (isinstance(voice_count, bool) or not isinstance(voice_count, int) or voice_count < 0
            or voice_count + len(history) != len(references)):
        raise RequestError(f"voice_references {voice_count!r} and {len(history)} history turns do not account "
                           f"for {len(references)} references; send the voice clips, then one clip per turn")
    if voice_count > limits.max_references:
        raise RequestError(f"voice_references is {voice_count}; the limit is {limits.max_references}")
    voice = [Clip(_audio(r, f"references.{i}", limits), check_text(r.get("text"), f"references.{i}.text"))
             for i, r in enumerate(references[:voice_count])]
    turns = [Clip(_audio(r, f"references.{voice_count + i}", limits), turn)
             for i, (r, turn) in enumerate(zip(references[voice_count:], history))]
    character = None
    raw = envelope.get("character")
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise RequestError("envelope character must be an object {name, description, scene?}")
        if voice_count:
            raise RequestError("a described character cannot also have voice references; send one or the other")
        name: Any = raw.get("name")  # JSON values of any type: checked_character says what is wrong
        description: Any = raw.get("description")
        for field, value, limit in (("name", name, limits.max_id_chars), ("description", description,
                                    limits.max_text_chars), ("scene", raw.get("scene"), limits.max_text_chars)):
            _length(value, f"character.{field}", limit)
        character = checked_character(Character(name, description, raw.get("scene")))
    return SpeechRequest(text=line, references=voice, history=turns, character=character, sampling=sampling)

"""Saved voices: reference clips with their transcripts, or a described character, saved by name
in the store and used by name as `voice` in the speech API and as `saved_voice` in a directing
session's `voice.set` (docs/protocol.md §8.1).

    GET    /v1/audio/voices            {"object": "list", "data": [voice, ...]}
    POST   /v1/audio/voices            a voice from JSON or multipart form data (OpenAI's)
    DELETE /v1/audio/voices/{voice}    by id or name

Design choices:
- The shapes are OpenAI's (`client.audio.voices.create/delete` of the `openai` package work
  unchanged): a voice object has `id`, `object: "audio.voice"`, `name`, `created_at`, `type`
  (`audio_sample` for clips, `prompt` for a description) and `prompt`; Retake adds the clips'
  transcripts (`references`) and the `character`. OpenAI's multipart form (`name`,
  `audio_sample`, `consent`) needs one thing more for Drama 3: each clip's `transcript`
  (`extra_body` with the openai client). Its prompt voice (`type: "prompt"`, `prompt`)
  becomes a described character named as the voice. JSON takes `references` as `voice.set`
  does, or a `character`.
- A voice is checked when it is saved, the way a take will use it (its clips encoded by the
  engine, the prompt laid out), so a clip the engine cannot use is refused then, not at the
  first take. The clips are stored as they came (WAV or FLAC), so a voice outlives a change
  of checkpoint; the engine's encoding cache makes their use cheap.
- Names are unique (they are how a voice is asked for) and `default` is the engine's own
  voice; ids are `voice_` and 16 hex digits. `consent` (OpenAI's consent recording id) is kept
  with the voice as given: Retake holds no consent recordings.
- A directing session that uses a saved voice takes a copy (its codes), so deleting the saved
  voice never changes a session or its takes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend import json_input
from backend.clips import checked_clip
from backend.directing.loop import QueueFull
from backend.directing.protocol import CharacterSpec, Limits
from backend.directing.speech_options import DEFAULT_VOICE
from backend.state import ServerState
from backend.store import SavedVoice
from engine import Character, Drama3Engine, Reference, RequestError, Sampling, check_text, checked_character

MAX_NAME_CHARS = 64


def openai_error(message: str, status_code: int = 400) -> JSONResponse:
    kind = {400: "invalid_request_error", 404: "not_found_error", 409: "conflict_error"}.get(status_code,
                                                                                            "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status_code)


def voice_object(voice: SavedVoice) -> dict[str, Any]:
    """OpenAI's `audio.voice`, with the transcripts and the character."""
    character = voice.character
    return {"id": voice.voice_id, "object": "audio.voice", "name": voice.name, "created_at": voice.created_ms // 1000,
            "type": "prompt" if character is not None else "audio_sample",
            "prompt": None if character is None else character.description,
            "references": [{"text": text} for text in voice.transcripts],
            "character": None if character is None else {"name": character.name,
                                                         "description": character.description,
                                                         "scene": character.scene}}


def find_voice(state: ServerState, name: str | None) -> SavedVoice | None:
    """The saved voice of that name or id; None for none given or the engine's own voice. (On the
    store thread: `await state.db.run(find_voice, state, name)`.)"""
    if name is None or name == DEFAULT_VOICE:
        return None
    voice = state.store.saved_voice(name)
    if voice is None:
        names = [DEFAULT_VOICE, *(v.name for v in state.store.saved_voices())]
        raise RequestError(f"unknown voice {name!r}; the voices are {', '.join(names)} (save one with POST "
                           "/v1/audio/voices)")
    return voice


def _name(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError("name must be a non-empty string: the voice's name")
    name = value.strip()
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise RequestError(f"name must be at most {MAX_NAME_CHARS} printable characters")
    if name == DEFAULT_VOICE or name.startswith("voice_"):
        raise RequestError(f"name {name!r} is taken: '{DEFAULT_VOICE}' is the engine's voice and voice_... are ids")
    return name


def _clips(audio: list[bytes], texts: list[object], limits: Limits, field: str) -> list[tuple[bytes, str]]:
    if len(audio) > limits.max_references:
        raise RequestError(f"at most {limits.max_references} clips (got {len(audio)})")
    if len(texts) != len(audio):
        raise RequestError(f"each clip needs its transcript: {len(audio)} clips and {len(texts)} transcripts "
                           "(with the openai client, add extra_body={'transcript': ...})")
    clips = []
    for index, (data, text) in enumerate(zip(audio, texts)):
        if not data:
            raise RequestError(f"{field}.{index} is empty; give a WAV or FLAC clip")
        if len(data) > limits.max_reference_bytes:
            raise RequestError(f"{field}.{index} is {len(data)} bytes; the most is {limits.max_reference_bytes}")
        clips.append((data, check_text(text, f"transcript.{index}")))
    return clips


async def _parse(request: Request, limits: Limits) -> tuple[str, list[tuple[bytes, str]], Character | None, str | None]:
    """name, clips, character and consent of a POST body (RequestError says what to change)."""
    fields: Mapping[str, Any]
    audio: list[bytes] = []
    texts: list[object] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        async with request.form(max_files=limits.max_references + 1, max_fields=64,
                                max_part_size=limits.max_reference_bytes) as form:
            fields = {key: form.get(key) for key in ("name", "type", "prompt", "consent")}
            audio = [await part.read() for part in form.getlist("audio_sample") if isinstance(part, UploadFile)]
            if len(audio) != len(form.getlist("audio_sample")):
                raise RequestError("audio_sample must be a file")
            texts = list(form.getlist("transcript"))
        field = "audio_sample"
    else:
        try:
            body = json_input.loads(await request.body())
        except ValueError as error:
            raise RequestError(f"the body must be JSON or multipart form data: {error}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        fields = body
        references = body.get("references") or []
        if not isinstance(references, list) or not all(isinstance(r, dict) for r in references):
            raise RequestError("references must be a list of objects {audio: base64 WAV or FLAC, text: transcript}")
        for index, reference in enumerate(references):
            try:
                audio.append(base64.b64decode(reference.get("audio") or "", validate=True))
            except (binascii.Error, ValueError, TypeError):
                raise RequestError(f"references.{index}.audio must be base64 of a WAV or FLAC file") from None
            texts.append(reference.get("text"))
        field = "references"
    name = _name(fields.get("name"))
    clips = _clips(audio, texts, limits, field)
    character = None
    raw: Any = fields.get("character")  # JSON values of any type: checked_character says what is wrong
    if fields.get("type") == "prompt" or fields.get("prompt") is not None:
        prompt: Any = fields.get("prompt")
        character = Character(name, prompt)
    elif raw is not None:
        if not isinstance(raw, dict):
            raise RequestError("character must be an object {name, description, scene?}")
        who: Any = raw.get("name")
        description: Any = raw.get("description")
        character = Character(who, description, raw.get("scene"))
    if character is not None:
        character = checked_character(character)
    if bool(clips) == (character is not None):
        raise RequestError("a voice is reference clips with their transcripts, or a described character (a prompt): "
                           "give one of them")
    consent = fields.get("consent")
    return name, clips, character, None if consent is None else str(consent)


def _check(clips: list[tuple[bytes, str]], character: Character | None) -> Any:
    def check(engine: Drama3Engine) -> None:
        """Encode the clips and lay out a prompt with the voice, as a take will."""
        references = []
        for index, (audio, text) in enumerate(clips):
            try:
                references.append(Reference(engine.encode_reference(audio), text))
            except RequestError as error:
                raise RequestError(f"clip {index}: {error}") from None
        engine.prompt("Check.", character or references, [], Sampling(max_new_tokens=1, seed=0))

    return check


async def voices(request: Request) -> Response:
    state: ServerState = request.app.state.retake
    if request.method == "GET":
        saved = await state.db.run(state.store.saved_voices)
        return JSONResponse({"object": "list", "data": [voice_object(v) for v in saved]})
    try:
        name, clips, character, consent = await _parse(request, state.settings.limits)
        if await state.db.run(state.store.saved_voice, name) is not None:
            return openai_error(f"a voice named {name!r} exists; delete it first or pick another name", 409)
        checked = []  # each clip checked off the loop (its header, then in blocks) before the engine decodes it
        for index, (audio, text) in enumerate(clips):
            clean, _seconds = await checked_clip(audio, state.settings.limits.max_reference_seconds, f"clip {index}")
            checked.append((clean, text))
        await state.call(_check(checked, character))
    except RequestError as error:
        return openai_error(str(error))
    except QueueFull as error:
        return JSONResponse({"error": {"message": str(error), "type": "server_error", "param": None, "code": None}},
                            status_code=503, headers={"Retry-After": str(error.retry_after_s)})
    spec = None if character is None else CharacterSpec(character.name, character.description, character.scene)
    voice = await state.db.run(state.store.save_voice, name, clips, spec, consent)
    if voice is None:  # saved by another request meanwhile
        return openai_error(f"a voice named {name!r} exists; delete it first or pick another name", 409)
    return JSONResponse(voice_object(voice))


async def delete_voice(request: Request) -> Response:
    state: ServerState = request.app.state.retake
    key = request.path_params["voice"]
    voice = await state.db.run(state.store.delete_saved_voice, key)
    if voice is None:
        return openai_error(f"no voice {key!r}; GET /v1/audio/voices lists them", 404)
    return JSONResponse({"id": voice.voice_id, "object": "audio.voice.deleted", "deleted": True})

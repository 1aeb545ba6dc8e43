"""The fields of OpenAI's speech API in a `/v1/audio/speech` body, beside the seed's (speech_request.py).

    options = parse_speech_options(body)      # RequestError says what to change
    request = with_voice(request, options.instructions, saved)   # the voice and instructions applied

- `response_format`: mp3, opus, aac, flac, wav, pcm (backend/audio_formats.py); default mp3
  (OpenAI's), or pcm with Retake's `stream: true`.
- `stream_format`: `audio` (the encoded audio as it is made) or `sse` (`speech.audio.delta`
  events); giving it streams.
- `stream`: Retake's own switch, from before `stream_format`: true streams.
- `voice`: a saved voice's name or id, or `{"id": ...}`; `default` (or none) is the engine's
  own voice.
- `instructions`: how to say the line, laid onto the described-character layout (below).
- `speed`: 1.0 only. `model`: any string (Retake serves its one engine).

Design choices:
- OpenAI streams whenever `stream_format` is given; Retake's clients send `stream: true` and
  read raw PCM16, so `stream: true` keeps `pcm` as its default format. `stream: false` with a
  `stream_format` contradicts itself and is refused rather than guessed.
- `instructions` means what OpenAI's does (how to speak the line), and Drama 3 takes that as a
  described character: with a described voice (a saved one, or the seed envelope's
  `character`) the instructions join its scene, the line that sets up the performance; with
  the engine's own voice they become the description of a character named `Speaker`. A voice
  of reference clips cannot also be described (the model takes one or the other), so
  instructions with clips are refused with what to do instead.
- `speed` other than 1.0 is refused: Retake does not time-stretch takes (the model's pacing is
  the performance, and stretching would make streamed and exported takes differ); the
  message points at `instructions` for a faster or slower delivery.
- An unknown voice, OpenAI's built-in names (`alloy`, ...) included, is refused with the list
  of voices: a voice silently replaced by another is worse than an error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from backend.audio_formats import FORMATS
from backend.directing.speech_request import Clip, SpeechRequest
from backend.store import SavedVoice
from engine import Character, RequestError, checked_character

DEFAULT_VOICE = "default"  # the engine's own voice, by name
INSTRUCTED_SPEAKER = "Speaker"  # the character that instructions describe when the voice is the engine's
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range


@dataclass(frozen=True)
class SpeechOptions:
    response_format: str  # a key of audio_formats.FORMATS
    native: bool  # raw PCM at the take's rate: Retake's `stream: true` without a response_format
    streamed: bool
    stream_format: Literal["audio", "sse"]
    voice: str | None  # a voice's name or id as given; None: none given
    instructions: str | None


def _choice(body: Mapping[str, object], name: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(name, default)
    if value not in choices:
        listed = ", ".join(f'"{choice}"' for choice in choices)
        raise RequestError(f"{name} must be one of {listed}; got {value!r}")
    return str(value)


def parse_speech_options(body: Mapping[str, object]) -> SpeechOptions:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("stream must be true or false")
    stream_format = _choice(body, "stream_format", ("audio", "sse"), "audio")
    if stream is False and "stream_format" in body:
        raise RequestError("stream is false but stream_format asks for a stream; drop one of them")
    streamed = stream if stream is not None else "stream_format" in body
    response_format = _choice(body, "response_format", tuple(FORMATS), "pcm" if stream else "mp3")

    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not math.isfinite(speed):
        raise RequestError(f"speed must be a number; got {speed!r}")
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise RequestError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}; got {speed}")
    if speed != 1.0:
        raise RequestError(f"speed must be 1.0: Retake does not time-stretch a take (got {speed}); ask for a faster "
                           "or slower delivery in instructions instead")

    voice = body.get("voice")
    if isinstance(voice, Mapping):
        voice = voice.get("id")  # OpenAI's custom voice reference {"id": "voice_..."}
    if voice is not None and (not isinstance(voice, str) or not voice.strip()):
        raise RequestError('voice must be a voice\'s name or id (a string), or {"id": ...}')
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string: how to say the line")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string (any: Retake serves its one engine)")
    native = bool(stream) and "response_format" not in body
    return SpeechOptions(response_format, native, streamed, "sse" if stream_format == "sse" else "audio", voice,
                         instructions.strip() or None if instructions is not None else None)


def with_voice(request: SpeechRequest, instructions: str | None, saved: SavedVoice | None) -> SpeechRequest:
    """The request with a saved voice (None: the body's own voice, or the engine's) and the instructions
    laid onto the described-character layout."""
    if saved is not None:
        if request.references or request.character:
            raise RequestError(f"voice {saved.name!r} and the body's own voice (references or an envelope "
                               "character) are two voices; give one")
        character = None if saved.character is None else Character(
            saved.character.name, saved.character.description, saved.character.scene)
        request = dataclasses.replace(request, references=[Clip(audio, text) for audio, text in saved.clips],
                                      character=character)
    if instructions is None:
        return request
    if request.references:
        named = f"voice {saved.name!r} is" if saved is not None else "the references are"
        raise RequestError(f"instructions describe how to speak, and Drama 3 takes a voice as reference clips or as a "
                           f"description, never both: {named} clips. Drop instructions, or use a described voice "
                           "(a saved character, or the default voice)")
    character = request.character
    if character is None:
        described = Character(INSTRUCTED_SPEAKER, instructions)
    else:
        described = dataclasses.replace(character, scene=" ".join(filter(None, [character.scene, instructions])))
    try:
        return dataclasses.replace(request, character=checked_character(described))
    except RequestError as error:
        raise RequestError(f"instructions: {error}") from None

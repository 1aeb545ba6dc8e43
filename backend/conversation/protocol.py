"""The conversation protocol on `/converse`: typed messages, and client text frames parsed into them.

Design choices (docs/protocol.md §9 is the full description; tests/fixtures/protocol/
conversation_*.json hold samples that the TypeScript side is tested against too):

- As on `/ws` (backend/directing/protocol/): text frames are JSON objects with a `type`,
  each message a frozen dataclass whose `type` is a `Literal`; server messages carry every
  field, `type` first. The messages are few and flat, so the parser sits beside them.
- Audio travels in binary frames both ways: the user's as bare PCM16, the agent's with the
  header of backend/transport.py (one frame per tick).
- A refused client message is a `ConversationError(code, message)` that says what to
  change. Before `converse.ready` the socket answers every refusal with `bad_field` (the
  client may open again); after it, with the code raised here.
- Unknown fields are ignored, so newer clients keep working with older servers.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass
from typing import Literal, TypeAlias

from backend import json_input

MAX_PERSONA_CHARS = 4000

ErrorCode = Literal[
    "bad_field",  # a converse.open field is wrong, or anything but converse.open came first
    "bad_json",  # not JSON, or not a JSON object
    "unknown_type",  # `type` missing or not a message of this protocol (or converse.open again)
    "busy",  # every conversation slot is in use; the socket is closed (1013)
    "converse_off",  # the server runs no conversation engine; the socket is closed (1008)
    "too_fast",  # more user audio waits than the conversation can hear soon; closed (1008)
    "internal",  # a tick failed; closed (1011)
]


class ConversationError(Exception):
    """A client message the server refuses; becomes an `error` message on the socket."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


# ─── Client → server ──────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ConversationOpen:
    persona: str | None = None  # None: the engine's default persona
    voice: str | None = None  # a voice name of the engine
    seed: int | None = None
    voice_clip: bytes | None = None  # a WAV or FLAC file (base64 on the wire), instead of a named voice
    type: Literal["converse.open"] = "converse.open"


@dataclass(frozen=True)
class Ping:
    type: Literal["ping"] = "ping"


ClientMessage: TypeAlias = ConversationOpen | Ping


# ─── Server → client ──────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ConversationReady:
    sample_rate: int
    frame_samples: int
    voice: str | None  # the voice's name ("your clip" for a voice clip); None: the checkpoint has none
    voices: list[str]
    persona: str  # the persona in use
    demo_weights: bool
    type: Literal["converse.ready"] = "converse.ready"


@dataclass(frozen=True)
class ConversationListening:
    type: Literal["converse.listening"] = "converse.listening"


@dataclass(frozen=True)
class ConversationText:
    tick: int
    text: str
    type: Literal["converse.text"] = "converse.text"


@dataclass(frozen=True)
class Error:
    code: ErrorCode
    message: str
    type: Literal["error"] = "error"


@dataclass(frozen=True)
class Pong:
    type: Literal["pong"] = "pong"


ServerMessage: TypeAlias = ConversationReady | ConversationListening | ConversationText | Error | Pong


def dump(message: ServerMessage) -> str:
    """The JSON text frame of a server message (every field present, `type` first)."""
    fields = dataclasses.asdict(message)
    return json.dumps({"type": fields.pop("type"), **fields}, separators=(",", ":"), allow_nan=False)


# ─── Parsing ──────────────────────────────────────────────────────────────────


def _bad(message: str) -> ConversationError:
    return ConversationError("bad_field", message)


def _open(obj: dict[str, object]) -> ConversationOpen:
    persona, voice, seed, clip = obj.get("persona"), obj.get("voice"), obj.get("seed"), obj.get("voice_clip")
    if persona is not None and (not isinstance(persona, str) or len(persona) > MAX_PERSONA_CHARS):
        raise _bad(f"persona must be a string of at most {MAX_PERSONA_CHARS} characters")
    if voice is not None and not isinstance(voice, str):
        raise _bad("voice must be a voice name (a string)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise _bad("seed must be a non-negative integer")
    audio = None
    if clip is not None:
        if voice is not None:
            raise _bad("give a voice or a voice_clip, not both")
        try:
            audio = base64.b64decode(clip, validate=True) if isinstance(clip, str) else None
        except (binascii.Error, ValueError):
            audio = None
        if not audio:
            raise _bad("voice_clip must be a WAV or FLAC file, base64-encoded")
    return ConversationOpen(persona, voice, seed, audio)


def parse_client_message(text: str) -> ClientMessage:
    """A client text frame as a typed message, or ConversationError with a code and what to change."""
    try:
        obj = json_input.loads(text)
    except ValueError as error:
        raise ConversationError("bad_json", f"text frames must be JSON objects; this is not JSON: {error}") from None
    if not isinstance(obj, dict):
        raise ConversationError("bad_json", "text frames must be JSON objects")
    kind = obj.get("type")
    if kind == "converse.open":
        return _open(obj)
    if kind == "ping":
        return Ping()
    raise ConversationError("unknown_type", f"unknown message type {kind!r} (the conversation takes "
                                            "converse.open, then ping and audio)")

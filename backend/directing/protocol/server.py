"""Server → client messages on `/ws`, and the JSON text frame each becomes.

Design choices:
- Each message is a frozen dataclass whose `type` is a `Literal` default; `dump` writes every
  field (null when absent), `type` first, so the client never guesses between "missing" and "null".
- Replies name the client message they answer by its `ref`; messages about a take (started,
  retry, done) carry its `take_id` instead.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal, TypeAlias

from backend.directing.protocol.errors import ErrorCode, ProtocolError
from backend.directing.protocol.info import CastInfo, FinishReason, LineInfo, SamplingInfo, TakeInfo, VoiceInfo

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class SessionReady:
    session_id: str
    resumed: bool
    engine: str
    sample_rate: int
    frame_samples: int
    demo_weights: bool
    limits: dict[str, int | float]
    voice: VoiceInfo | None
    lines: list[LineInfo]  # the script, in order (lines without takes too; deleted lines not)
    takes: list[TakeInfo]  # every take, those of deleted lines too
    history: list[int]  # every kept take of the script, in script order
    hears: dict[str, int]  # line id -> how many of `history` (its first ones) a new take of the line hears
    cast: list[CastInfo]  # the scene's characters, in cast order
    name: str  # the scene's name ("" unnamed)
    session_key: str | None = None  # a new session's key (or a first resume's, of a session from before keys)
    protocol: int = PROTOCOL_VERSION
    ref: str | None = None
    type: Literal["session.ready"] = "session.ready"


@dataclass(frozen=True)
class VoiceReady:
    voice: VoiceInfo | None
    ref: str | None = None
    type: Literal["voice.ready"] = "voice.ready"


@dataclass(frozen=True)
class Script:
    """The script after a line.set / line.delete / line.order (the reply to each)."""

    lines: list[LineInfo]  # in script order
    history: list[int]  # every kept take of the script, in script order
    hears: dict[str, int]  # line id -> how many of `history` (its first ones) a new take of the line hears
    ref: str | None = None
    type: Literal["script"] = "script"


@dataclass(frozen=True)
class TakeQueued:
    take_id: int
    line_id: str
    position: int  # jobs ahead of this take in the engine queue
    deadline_ms: int
    audio_url: str  # the take's WAV export once it is done
    voice_id: int | None  # the voice the take speaks with (null: the engine's default)
    sampling: SamplingInfo  # what the take asked for, the seed included (picked here when not given)
    character_id: str | None  # the cast member whose take it is (None: no cast)
    guard_frames: int | None  # the length guard's cap on its frames (None: not guarded)
    ref: str | None = None
    type: Literal["take.queued"] = "take.queued"


@dataclass(frozen=True)
class TakeStarted:
    take_id: int
    attempt: int  # 1 for the first attempt; see take.retry
    sampling: SamplingInfo  # what this attempt samples with (a retry changes the seed)
    type: Literal["take.started"] = "take.started"


@dataclass(frozen=True)
class TakeRetry:
    take_id: int
    attempt: int  # the attempt that starts now (2, 3, ...); its audio restarts at sample 0
    reason: Literal["silence"]
    message: str
    type: Literal["take.retry"] = "take.retry"


@dataclass(frozen=True)
class TakeDone:
    take_id: int
    finish_reason: FinishReason
    timings: dict[str, float | int | None]
    frames: int
    samples: int
    attempts: int
    audio_url: str
    error: str | None = None
    type: Literal["take.done"] = "take.done"


@dataclass(frozen=True)
class History:
    """A take's history (`take_id`), or the script's after a take.keep / take.drop (`take_id` null)."""

    take_ids: list[int]  # oldest first
    dropped: list[int]  # kept takes left out because the prompt would pass max_prompt_rows
    take_id: int | None = None  # the take this history conditions; null = every kept take of the script
    hears: dict[str, int] | None = None  # as in `script`; null for a take's history
    unkept: list[int] = dataclasses.field(default_factory=list)  # takes a keep un-kept (one kept take a line)
    type: Literal["history"] = "history"


@dataclass(frozen=True)
class Error:
    code: ErrorCode
    message: str
    take_id: int | None = None
    ref: str | None = None
    retry_after_ms: int | None = None
    type: Literal["error"] = "error"

    @classmethod
    def of(cls, error: ProtocolError) -> Error:
        return cls(error.code, error.message, error.take_id, error.ref, error.retry_after_ms)


@dataclass(frozen=True)
class Pong:
    t: float | None = None
    ref: str | None = None
    type: Literal["pong"] = "pong"


@dataclass(frozen=True)
class Cast:
    """The cast after a cast.set or cast.delete (the reply to each)."""

    characters: list[CastInfo]  # in cast order
    ref: str | None = None
    type: Literal["cast"] = "cast"


@dataclass(frozen=True)
class TakeNoted:
    """A take's note and rating as stored (the reply to take.note)."""

    take_id: int
    note: str
    rating: int
    ref: str | None = None
    type: Literal["take.noted"] = "take.noted"


ServerMessage: TypeAlias = (
    SessionReady | VoiceReady | Script | TakeQueued | TakeStarted | TakeRetry | TakeDone | History | Error | Pong
    | Cast | TakeNoted
)


def dump(message: ServerMessage) -> str:
    """The JSON text frame of a server message (every field present, `type` first)."""
    fields = dataclasses.asdict(message)
    return json.dumps({"type": fields.pop("type"), **fields}, separators=(",", ":"), allow_nan=False)

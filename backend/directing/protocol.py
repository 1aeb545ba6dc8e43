"""The directing protocol on `/ws`: typed messages.

Design choices (docs/protocol.md is the full description; tests/fixtures/protocol/ holds
samples that the TypeScript side, frontend/src/studio/protocol.ts, is tested against too):

- Text frames are JSON objects with a `type`. Each message is a frozen dataclass whose
  `type` is a `Literal`, so a message's wire name appears once and a `match` over the
  union is exhaustive under a type checker.
- Client messages are checked by hand in backend/directing/parse.py (no schema library): each
  check names the field and says what to change, and raises `ProtocolError(code, message)`.
- Server messages always carry every field (null when absent), so the client never
  guesses between "missing" and "null".
- Audio travels as binary frames (backend/transport.py: a 16-byte little-endian header,
  then PCM16 samples). Control never travels in binary frames, and the client never sends
  binary frames.
- The script (lines and their order) is the server's: `line.set`, `line.delete` and
  `line.order` change it, and each is answered with the whole script (`script`), so a client
  converges on what was stored whatever it guessed locally. So is the directing history
  (backend/directing/script.py): which take of a line is kept, and what each line hears.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypedDict

from engine import Sampling  # the one sampling type (no torch: engine/__init__.py loads the model code lazily)

PROTOCOL_VERSION = 1

ErrorCode = Literal[
    # The message itself is wrong: these count towards the protocol-error limit.
    "bad_json",  # not valid JSON, or not a JSON object
    "unknown_type",  # `type` missing or not a message this server knows
    "bad_field",  # a field is missing, of the wrong type or out of range (the message names it)
    "binary_not_supported",  # the client sent a binary frame
    "message_too_big",  # a frame larger than limits.max_message_bytes
    "session_not_open",  # a message other than session.open before session.open
    # The message is well formed but cannot be done now.
    "session_already_open",  # a second session.open on one socket
    "unknown_session",  # session.open with a session_id the server has never stored
    "scene_deleted",  # session.open of a deleted scene, or the scene held was deleted (then close 1000)
    "session_taken_over",  # another socket resumed this session; this one is closed
    "too_many_sessions",  # limits.max_sessions sockets are open; the socket is closed
    "unknown_take",  # a take_id that is not a take of this session
    "unknown_line",  # a line_id (or `after`) that is not a line of this session's script
    "unknown_character",  # a character_id that is not a member of this session's cast
    "too_many_characters",  # the cast holds limits.max_cast characters
    "too_many_lines",  # the script holds limits.max_lines_per_session lines
    "take_not_finished",  # keep (or use as history) a take that is still queued or running
    "take_not_usable",  # keep (or use as history) a take without audio (error, or 0 frames)
    "too_many_takes",  # the session holds limits.max_takes_per_session takes
    "busy",  # the engine queue is full; retry after retry_after_ms
    "draining",  # the replica is draining (SIGTERM): reconnect (close 1012 follows) and start the take there
    "bad_reference",  # the engine refused a reference clip (format, length, transcript)
    "internal",  # a server fault; the socket stays usable
]
PROTOCOL_ERRORS: frozenset[str] = frozenset(
    {"bad_json", "unknown_type", "bad_field", "binary_not_supported", "message_too_big", "session_not_open"}
)

FinishReason = Literal["stop", "length", "deadline", "cancelled", "error"]
TakeState = Literal["queued", "running", "done"]


class ProtocolError(Exception):
    """A client message the server refuses; becomes an `error` message on the socket."""

    def __init__(self, code: ErrorCode, message: str, *, take_id: int | None = None, ref: str | None = None,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.take_id = take_id
        self.ref = ref
        self.retry_after_ms = retry_after_ms


# ─── Client → server ──────────────────────────────────────────────────────────


@dataclass(frozen=True)
class SessionOpen:
    session_id: str | None = None
    session_key: str | None = None  # the key session.ready gave when the session was made; resuming needs it
    ref: str | None = None
    type: Literal["session.open"] = "session.open"


@dataclass(frozen=True)
class ReferenceClip:
    audio: bytes  # WAV or FLAC file bytes (base64 on the wire)
    text: str  # what the clip says


@dataclass(frozen=True)
class CharacterSpec:
    name: str
    description: str
    scene: str | None = None


@dataclass(frozen=True)
class VoiceSet:
    references: tuple[ReferenceClip, ...] = ()
    character: CharacterSpec | None = None  # never together with references; neither = default voice
    ref: str | None = None
    saved_voice: str | None = None  # a saved voice's name or id (backend/directing/voices.py), alone
    type: Literal["voice.set"] = "voice.set"


@dataclass(frozen=True)
class TakeStart:
    line_id: str
    text: str
    sampling: Sampling  # the client's fields over the engine's defaults, checked; seed None = the server picks
    history: Literal["kept"] | tuple[int, ...] = "kept"
    deadline_ms: int | None = None  # None = limits.default_deadline_ms
    ref: str | None = None
    length_guard: bool = True  # cap the take's frames by its line's length (backend/directing/length_guard.py)
    type: Literal["take.start"] = "take.start"


@dataclass(frozen=True)
class TakeCancel:
    take_id: int
    ref: str | None = None
    type: Literal["take.cancel"] = "take.cancel"


@dataclass(frozen=True)
class TakeKeep:
    take_id: int
    ref: str | None = None
    type: Literal["take.keep"] = "take.keep"


@dataclass(frozen=True)
class TakeDrop:
    take_id: int
    ref: str | None = None
    type: Literal["take.drop"] = "take.drop"


@dataclass(frozen=True)
class LineSet:
    """Create a line or change its text; with `place`, also move it after `after` (None: to the top);
    with `cast`, also give it to `character_id` (None: the scene's first character)."""

    line_id: str
    text: str  # may be empty: a line being written
    after: str | None = None
    place: bool = False  # whether the message gave `after`; without it a new line goes last, a known one stays
    ref: str | None = None
    character_id: str | None = None
    cast: bool = False  # whether the message gave `character_id`; without it the line's character stays
    type: Literal["line.set"] = "line.set"


@dataclass(frozen=True)
class CastVoice:
    """A cast member's voice: reference clips, a description (a described character), a saved
    voice (by name or id: a copy of its clips or description), or none (the engine's default voice)."""

    references: tuple[ReferenceClip, ...] = ()
    description: str | None = None
    scene: str | None = None
    saved_voice: str | None = None


@dataclass(frozen=True)
class CastSet:
    """Add a character to the cast, or rename it; with `voice`, also give it that voice."""

    character_id: str
    name: str
    voice: CastVoice | None = None  # None: the member's voice stays (a new member: the default voice)
    ref: str | None = None
    type: Literal["cast.set"] = "cast.set"


@dataclass(frozen=True)
class CastDelete:
    character_id: str
    ref: str | None = None
    type: Literal["cast.delete"] = "cast.delete"


@dataclass(frozen=True)
class TakeNote:
    """The director's note and rating of a take; a field left out stays as it is."""

    take_id: int
    note: str | None = None  # "" clears it
    rating: int | None = None  # 1..5; 0 clears it
    ref: str | None = None
    type: Literal["take.note"] = "take.note"


@dataclass(frozen=True)
class LineDelete:
    line_id: str
    ref: str | None = None
    type: Literal["line.delete"] = "line.delete"


@dataclass(frozen=True)
class LineOrder:
    line_ids: tuple[str, ...]  # every line of the script, once, top first
    ref: str | None = None
    type: Literal["line.order"] = "line.order"


@dataclass(frozen=True)
class Ping:
    t: float | None = None  # echoed in pong
    ref: str | None = None
    type: Literal["ping"] = "ping"


ClientMessage: TypeAlias = (
    SessionOpen | VoiceSet | LineSet | LineDelete | LineOrder | TakeStart | TakeCancel | TakeKeep | TakeDrop | Ping
    | CastSet | CastDelete | TakeNote
)


@dataclass(frozen=True)
class Limits:
    """What the server accepts; sent in session.ready and enforced by parse_client_message."""

    max_message_bytes: int = 12 * 2**20
    max_reference_bytes: int = 8 * 2**20
    max_reference_seconds: float = 60.0
    max_references: int = 4
    max_text_chars: int = 2000
    max_id_chars: int = 128
    max_takes_per_session: int = 1000
    max_lines_per_session: int = 1000
    max_sessions: int = 64
    max_queue: int = 16
    default_deadline_ms: int = 120_000
    max_deadline_ms: int = 600_000
    max_new_tokens: int = 1200
    max_prompt_rows: int = 8192
    max_protocol_errors: int = 20
    max_cast: int = 16  # characters in a scene's cast (Drama 3 has 16 speaker tags)
    max_name_chars: int = 64  # a character's name
    max_note_chars: int = 2000  # a take's note

    def to_json(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)


# ─── Server → client ──────────────────────────────────────────────────────────


class ReferenceInfo(TypedDict):
    text: str
    frames: int


class CharacterInfo(TypedDict):
    name: str
    description: str
    scene: str | None


class VoiceInfo(TypedDict):
    voice_id: int
    references: list[ReferenceInfo]
    character: CharacterInfo | None


class LineInfo(TypedDict):
    line_id: str
    text: str  # set by line.set, or by the line's latest take.start
    position: int  # 0, 1, ... in script order
    character_id: str | None  # the cast member who says it (None: the scene's first)


class CastInfo(TypedDict):
    character_id: str
    name: str
    position: int  # 0, 1, ... in cast order; 0 says every line not given to another
    voice: VoiceInfo | None  # None: the engine's default voice


class SamplingInfo(TypedDict):
    """A take's sampling on the wire and in the store: the fields of the engine's `Sampling`
    (`dataclasses.asdict`), with the seed that was used."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int  # the seed actually used (the server picks one when the client gives none)


class TakeInfo(TypedDict):
    take_id: int
    line_id: str
    text: str
    voice_id: int | None
    sampling: SamplingInfo
    history: list[int]  # the kept takes this take was conditioned on (after dropping)
    kept: bool
    state: TakeState
    finish_reason: FinishReason | None
    error: str | None
    timings: dict[str, float | int | None]
    frames: int
    samples: int
    attempts: int
    audio_url: str
    created_ms: int  # Unix time in milliseconds
    character_id: str | None  # the cast member it is a take of (None: no cast, the session's voice)
    note: str  # the director's note ("" none)
    rating: int  # 1..5, 0: not rated
    guard_frames: int | None  # the length guard's cap on its frames (None: not guarded)


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


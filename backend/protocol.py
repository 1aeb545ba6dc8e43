"""The directing protocol on `/ws`: typed messages, their checks, and the audio frame header.

Design choices (docs/protocol.md is the full description; tests/fixtures/protocol/ holds
samples that the TypeScript side, frontend/src/protocol.ts, is tested against too):

- Text frames are JSON objects with a `type`. Each message is a frozen dataclass whose
  `type` is a `Literal`, so a message's wire name appears once and a `match` over the
  union is exhaustive under a type checker.
- Client messages are parsed by hand (no schema library): each check names the field
  and says what to change, and raises `ProtocolError(code, message)`. Unknown fields are
  ignored so that newer clients keep working with older servers.
- Server messages always carry every field (null when absent), so the client never
  guesses between "missing" and "null".
- Audio travels as binary frames: a 16-byte little-endian header, then PCM16 samples.
  Control never travels in binary frames, and the client never sends binary frames.
- The script (lines and their order) is the server's: `line.set`, `line.delete` and
  `line.order` change it, and each is answered with the whole script (`script`), so a client
  converges on what was stored whatever it guessed locally.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import struct
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypedDict

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
    "session_taken_over",  # another socket resumed this session; this one is closed
    "too_many_sessions",  # limits.max_sessions sockets are open; the socket is closed
    "unknown_take",  # a take_id that is not a take of this session
    "unknown_line",  # a line_id (or `after`) that is not a line of this session's script
    "too_many_lines",  # the script holds limits.max_lines_per_session lines
    "take_not_finished",  # keep (or use as history) a take that is still queued or running
    "take_not_usable",  # keep (or use as history) a take without audio (error, or 0 frames)
    "too_many_takes",  # the session holds limits.max_takes_per_session takes
    "busy",  # the engine queue is full; retry after retry_after_ms
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
    type: Literal["voice.set"] = "voice.set"


@dataclass(frozen=True)
class SamplingSpec:
    """What the client asked for; None = the engine's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class TakeStart:
    line_id: str
    text: str
    sampling: SamplingSpec = SamplingSpec()
    history: Literal["kept"] | tuple[int, ...] = "kept"
    deadline_ms: int | None = None  # None = limits.default_deadline_ms
    ref: str | None = None
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
    """Create a line or change its text; with `place`, also move it after `after` (None: to the top)."""

    line_id: str
    text: str  # may be empty: a line being written
    after: str | None = None
    place: bool = False  # whether the message gave `after`; without it a new line goes last, a known one stays
    ref: str | None = None
    type: Literal["line.set"] = "line.set"


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


class SamplingInfo(TypedDict):
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
    ref: str | None = None
    type: Literal["script"] = "script"


@dataclass(frozen=True)
class TakeQueued:
    take_id: int
    line_id: str
    position: int  # jobs ahead of this take in the engine queue
    deadline_ms: int
    audio_url: str  # the take's WAV export once it is done
    ref: str | None = None
    type: Literal["take.queued"] = "take.queued"


@dataclass(frozen=True)
class TakeStarted:
    take_id: int
    attempt: int  # 1 for the first attempt; see take.retry
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
    take_ids: list[int]  # oldest first
    dropped: list[int]  # kept takes left out because the prompt would pass max_prompt_rows
    take_id: int | None = None  # the take this history conditions; null = every kept take of the script
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


ServerMessage: TypeAlias = (
    SessionReady | VoiceReady | Script | TakeQueued | TakeStarted | TakeRetry | TakeDone | History | Error | Pong
)


def dump(message: ServerMessage) -> str:
    """The JSON text frame of a server message (every field present, `type` first)."""
    fields = dataclasses.asdict(message)
    return json.dumps({"type": fields.pop("type"), **fields}, separators=(",", ":"), allow_nan=False)


# ─── Parsing client messages ──────────────────────────────────────────────────

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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(path + name, "a finite number")
    if value < low or value > high or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise _bad(path + name, f"in {interval} (got {value:g})")
    return float(value)


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
            raise _bad(f"line_ids.{index}", f"a line id (a non-empty string of at most {limits.max_id_chars} characters)")
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
    return LineSet(line_id, text, after, place, ref)


def _sampling(obj: JsonObject | None, limits: Limits) -> SamplingSpec:
    if obj is None:
        return SamplingSpec()
    top_k = _integer(obj, "top_k", 1, 2**31 - 1, required=False, path="sampling.")
    max_new_tokens = _integer(obj, "max_new_tokens", 1, limits.max_new_tokens, required=False, path="sampling.")
    seed = _integer(obj, "seed", 0, 2**63 - 1, required=False, path="sampling.")
    return SamplingSpec(
        temperature=_number(obj, "temperature", 0.0, 100.0, path="sampling."),
        top_p=_number(obj, "top_p", 0.0, 1.0, low_open=True, path="sampling."),
        top_k=top_k, max_new_tokens=max_new_tokens, seed=seed,
    )


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


def _voice(obj: JsonObject, limits: Limits, ref: str | None) -> VoiceSet:
    raw_references = obj.get("references")
    character = _object(obj, "character")
    if raw_references is not None and not isinstance(raw_references, list):
        raise _bad("references", "a list of {audio, text} objects")
    references = raw_references or []
    if references and character is not None:
        raise ProtocolError("bad_field", "give either references or a character, not both")
    if len(references) > limits.max_references:
        raise _bad("references", f"at most {limits.max_references} clips (got {len(references)})")
    clips = []
    for index, item in enumerate(references):
        path = f"references.{index}."
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
    spec = None
    if character is not None:
        name = _string(character, "name", limits.max_id_chars, path="character.")
        description = _string(character, "description", limits.max_text_chars, path="character.")
        scene = _string(character, "scene", limits.max_text_chars, required=False, path="character.")
        assert name is not None and description is not None
        spec = CharacterSpec(name, description, scene)
    return VoiceSet(tuple(clips), spec, ref)


def parse_client_message(text: str | bytes, limits: Limits) -> ClientMessage:
    """A client text frame as a typed message, or ProtocolError with a code and what to change."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_message_bytes:
        raise ProtocolError("message_too_big", f"messages are limited to {limits.max_message_bytes} bytes "
                                               f"(got {size})")
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
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
        return SessionOpen(_string(obj, "session_id", limits.max_id_chars, required=False), ref)
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
        return TakeStart(line_id, text, _sampling(_object(obj, "sampling"), limits),
                         _history(obj.get("history"), limits), deadline_ms, ref)
    if kind == "take.cancel":
        return TakeCancel(_take_id(obj), ref)
    if kind == "take.keep":
        return TakeKeep(_take_id(obj), ref)
    if kind == "take.drop":
        return TakeDrop(_take_id(obj), ref)
    if kind == "ping":
        return Ping(_number(obj, "t", -1e300, 1e300), ref)
    if not isinstance(kind, str):
        raise ProtocolError("unknown_type", "a message needs a string type, such as \"take.start\"")
    raise ProtocolError("unknown_type", f"unknown message type {kind[:64]!r}")


# ─── Binary audio frames ──────────────────────────────────────────────────────

AUDIO_HEADER = struct.Struct("<BBHIII")  # kind, flags, reserved, take_id, seq, start_sample
KIND_PCM16 = 1
FLAG_LAST = 1


@dataclass(frozen=True)
class AudioHeader:
    kind: int
    flags: int
    take_id: int
    seq: int  # 0, 1, ... per take attempt
    start_sample: int  # of the window's first sample, from the start of the take attempt

    @property
    def last(self) -> bool:
        return bool(self.flags & FLAG_LAST)


def pack_audio_frame(take_id: int, seq: int, start_sample: int, pcm: bytes, *, last: bool) -> bytes:
    """Header + PCM16 little-endian mono samples."""
    return AUDIO_HEADER.pack(KIND_PCM16, FLAG_LAST if last else 0, 0, take_id, seq, start_sample) + pcm


def unpack_audio_frame(frame: bytes) -> tuple[AudioHeader, bytes]:
    if len(frame) < AUDIO_HEADER.size or (len(frame) - AUDIO_HEADER.size) % 2:
        raise ValueError(f"an audio frame is a {AUDIO_HEADER.size}-byte header and whole PCM16 samples; "
                         f"got {len(frame)} bytes")
    kind, flags, _reserved, take_id, seq, start_sample = AUDIO_HEADER.unpack_from(frame)
    return AudioHeader(kind, flags, take_id, seq, start_sample), frame[AUDIO_HEADER.size:]

"""Client → server messages on `/ws`, and the limits the server holds them to.

Design choices:
- Each message is a frozen dataclass whose `type` is a `Literal` default, so its wire name
  appears once; backend/directing/parse.py builds them from JSON, checked field by field.
- A field the client may leave out has a default; where leaving it out means something other
  than the default (`after`, `character_id`), a flag says whether it was given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, TypeAlias

from engine import Sampling  # the one sampling type (no torch: engine/__init__.py loads the model code lazily)


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

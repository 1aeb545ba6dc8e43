"""What the server tells of a scene's records: voices, lines, the cast, takes (JSON objects inside
server messages, and what the store returns).

Design choices:
- TypedDicts, not dataclasses: they are built once (the store's rows, backend/store/) and go to
  the wire as they are, every field present (null when absent).
"""

from __future__ import annotations

from typing import Literal, TypedDict

FinishReason = Literal["stop", "length", "deadline", "cancelled", "error"]
TakeState = Literal["queued", "running", "done"]

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
    dropped: list[int]  # kept takes of its history left out so its prompt fits max_prompt_rows (oldest first)

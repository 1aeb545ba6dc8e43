"""The store's session voices: reference clips as codes, or a character, or both.

Design choices:
- A voice is never edited: setting one stores a new `voices` row, so the takes that spoke with
  an earlier one still name it (`takes.voice_id`).
- A voice's clips are kept as codes (what the engine conditions on), with their transcripts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backend.directing.protocol import CharacterInfo, CharacterSpec, VoiceInfo
from backend.schema import sessions, voice_references, voices
from backend.store.rows import Part, blob_to_codes, codes_to_blob, now_ms


@dataclass(frozen=True)
class StoredReference:
    text: str
    codes: np.ndarray  # int64 [codebooks, frames]


@dataclass(frozen=True)
class StoredVoice:
    voice_id: int
    references: list[StoredReference]
    character: CharacterSpec | None

    def info(self) -> VoiceInfo:
        character: CharacterInfo | None = None
        if self.character is not None:
            c = self.character
            character = {"name": c.name, "description": c.description, "scene": c.scene}
        return {"voice_id": self.voice_id, "character": character,
                "references": [{"text": r.text, "frames": int(r.codes.shape[1])} for r in self.references]}


def character_json(character: CharacterSpec | None) -> str | None:
    """A character as its column keeps it (JSON), or NULL."""
    if character is None:
        return None
    return json.dumps({"name": character.name, "description": character.description, "scene": character.scene})


def character_spec(column: str | None) -> CharacterSpec | None:
    """A character column read back."""
    return None if column is None else CharacterSpec(**json.loads(column))


class Voices(Part):
    """The session's voices (a part of Store)."""

    def set_voice(self, session_id: str, references: list[StoredReference],
                  character: CharacterSpec | None) -> StoredVoice | None:
        """Store a voice and make it the session's; neither references nor character = default voice."""
        this = sessions.c.session_id == session_id
        if not references and character is None:
            with self._transaction() as conn:
                conn.execute(sessions.update().where(this).values(voice_id=None))
            return None
        with self._transaction() as conn:
            voice_id = self._add_voice(conn, session_id, references, character)
            conn.execute(sessions.update().where(this).values(voice_id=voice_id))
        return StoredVoice(int(voice_id), references, character)

    def add_voice(self, session_id: str, references: list[StoredReference],
                  character: CharacterSpec | None) -> StoredVoice:
        """Store a voice of the session (a cast member's) without making it the session's voice."""
        with self._transaction() as conn:
            voice_id = self._add_voice(conn, session_id, references, character)
        return StoredVoice(voice_id, references, character)

    @staticmethod
    def _add_voice(conn: Connection, session_id: str, references: list[StoredReference],
                   character: CharacterSpec | None) -> int:
        key = conn.execute(voices.insert().values(session_id=session_id, character=character_json(character),
                                                  created_ms=now_ms())).inserted_primary_key
        assert key is not None
        voice_id = int(key[0])
        for index, reference in enumerate(references):
            codebooks, blob = codes_to_blob(reference.codes)
            conn.execute(voice_references.insert().values(voice_id=voice_id, idx=index, text=reference.text,
                                                          codebooks=codebooks, codes=blob))
        return voice_id

    def session_voice(self, session_id: str) -> StoredVoice | None:
        with self._transaction() as conn:
            voice_id = conn.execute(sa.select(sessions.c.voice_id).where(sessions.c.session_id == session_id)
                                    ).scalar_one_or_none()
        return None if voice_id is None else self.voice(voice_id)

    def voice(self, voice_id: int) -> StoredVoice:
        with self._transaction() as conn:
            row = conn.execute(sa.select(voices.c.character).where(voices.c.voice_id == voice_id)).first()
            if row is None:
                raise KeyError(f"no voice {voice_id}")
            clips = conn.execute(sa.select(voice_references.c.text, voice_references.c.codebooks,
                                           voice_references.c.codes)
                                 .where(voice_references.c.voice_id == voice_id).order_by(voice_references.c.idx))
            references = [StoredReference(r.text, blob_to_codes(r.codebooks, r.codes)) for r in clips]
        return StoredVoice(voice_id, references, character_spec(row.character))

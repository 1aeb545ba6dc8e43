"""The store's saved voices: the server's, by name, not a session's.

Design choices:
- Their clips are kept as uploaded (WAV or FLAC bytes, so they outlive a checkpoint), with their
  transcripts; a session that uses one stores its own copy as codes, like any voice
  (backend/store/voices.py), so deleting a saved voice changes no session.
- A name is unique (the table says so): saving under a taken name is refused, not replaced.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from backend.directing.protocol import CharacterSpec
from backend.schema import saved_voice_clips, saved_voices
from backend.store.rows import Part, now_ms
from backend.store.voices import character_json, character_spec


@dataclass(frozen=True)
class SavedVoice:
    """A voice saved by name: clips (WAV or FLAC files as uploaded) with their transcripts, or a character."""

    voice_id: str  # voice_ and 16 hex digits
    name: str
    created_ms: int
    transcripts: list[str]
    audio: list[bytes]  # one file per transcript; empty in `saved_voices()` (the listing)
    character: CharacterSpec | None
    consent: str | None  # OpenAI's consent recording id, as given

    @property
    def clips(self) -> list[tuple[bytes, str]]:
        return list(zip(self.audio, self.transcripts))


class SavedVoices(Part):
    """Saved voices: saved, listed, found, deleted (a part of Store)."""

    def save_voice(self, name: str, clips: list[tuple[bytes, str]], character: CharacterSpec | None,
                   consent: str | None) -> SavedVoice | None:
        """Save a voice under a new name (None: the name is taken)."""
        voice_id, created = f"voice_{secrets.token_hex(8)}", now_ms()
        try:
            with self._transaction() as conn:
                conn.execute(saved_voices.insert().values(voice_id=voice_id, name=name,
                                                          character=character_json(character),
                                                          consent=consent, created_ms=created))
                if clips:
                    conn.execute(saved_voice_clips.insert(), [{"voice_id": voice_id, "idx": index, "text": text,
                                                               "audio": audio}
                                                              for index, (audio, text) in enumerate(clips)])
        except sa.exc.IntegrityError:
            return None
        return SavedVoice(voice_id, name, created, [text for _, text in clips], [audio for audio, _ in clips],
                          character, consent)

    @staticmethod
    def _saved_voice(conn: Connection, row: Row[Any], with_audio: bool) -> SavedVoice:
        columns = [saved_voice_clips.c.text] + ([saved_voice_clips.c.audio] if with_audio else [])
        clips = conn.execute(sa.select(*columns).where(saved_voice_clips.c.voice_id == row.voice_id)
                             .order_by(saved_voice_clips.c.idx)).all()
        return SavedVoice(row.voice_id, row.name, int(row.created_ms), [c.text for c in clips],
                          [bytes(c.audio) for c in clips] if with_audio else [], character_spec(row.character),
                          row.consent)

    def saved_voices(self) -> list[SavedVoice]:
        """Every saved voice, oldest first, without the clips' audio."""
        with self._transaction() as conn:
            rows = conn.execute(sa.select(saved_voices).order_by(saved_voices.c.created_ms, saved_voices.c.name)).all()
            return [self._saved_voice(conn, row, with_audio=False) for row in rows]

    def saved_voice(self, key: str) -> SavedVoice | None:
        """The saved voice with this id or name, with its clips."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(saved_voices).where(
                sa.or_(saved_voices.c.voice_id == key, saved_voices.c.name == key))).first()
            return None if row is None else self._saved_voice(conn, row, with_audio=True)

    def delete_saved_voice(self, key: str) -> SavedVoice | None:
        """Delete the saved voice with this id or name; None if there is none. Sessions keep their copies."""
        voice = self.saved_voice(key)
        if voice is not None:
            with self._transaction() as conn:
                conn.execute(saved_voice_clips.delete().where(saved_voice_clips.c.voice_id == voice.voice_id))
                conn.execute(saved_voices.delete().where(saved_voices.c.voice_id == voice.voice_id))
        return voice

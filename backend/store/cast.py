"""The store's cast: a scene's characters, each with a voice, and which says each line.

Design choices:
- A cast member is a row of `cast_members`: an id the client chose (as for lines), a name, a
  voice (a row of `voices`, the session's like any other; NULL is the engine's default voice)
  and a place in the cast. The first member (position 0) says every line not given to
  another (`lines.character_id` NULL), so a scene with a cast never has a line without a voice.
- A member's voice is replaced, never edited: a new `voices` row each time, so the takes that
  spoke with the old one still name it (`takes.voice_id`).
- Removing a member frees its lines (they go back to the scene's first character); its takes
  keep their `character_id` and `voice_id`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backend.schema import cast_members, lines
from backend.store.rows import Part


@dataclass(frozen=True)
class CastMember:
    character_id: str
    name: str
    voice_id: int | None  # None: the engine's default voice
    position: int


KEEP_VOICE: Any = object()  # set_cast_member's `voice_id` when a member keeps its voice


class Cast(Part):
    """The scene's cast (a part of Store)."""

    def cast(self, session_id: str) -> list[CastMember]:
        """The scene's characters, in cast order."""
        with self._transaction() as conn:
            return self._cast(conn, session_id)

    @staticmethod
    def _cast(conn: Connection, session_id: str) -> list[CastMember]:
        rows = conn.execute(sa.select(cast_members.c.character_id, cast_members.c.name, cast_members.c.voice_id)
                            .where(cast_members.c.session_id == session_id)
                            .order_by(cast_members.c.position, cast_members.c.character_id)).all()
        return [CastMember(r.character_id, r.name, r.voice_id, k) for k, r in enumerate(rows)]

    def set_cast_member(self, session_id: str, character_id: str, name: str, voice_id: Any = KEEP_VOICE) -> None:
        """Add a member at the end of the cast (with `voice_id`, or the default voice), or rename an
        existing one (and give it `voice_id` unless KEEP_VOICE)."""
        this = sa.and_(cast_members.c.session_id == session_id, cast_members.c.character_id == character_id)
        with self._transaction() as conn:
            if conn.execute(sa.select(cast_members.c.character_id).where(this)).first() is None:
                conn.execute(cast_members.insert().values(
                    session_id=session_id, character_id=character_id, name=name,
                    voice_id=None if voice_id is KEEP_VOICE else voice_id,
                    position=len(self._cast(conn, session_id))))
                return
            changes: dict[str, Any] = {"name": name}
            if voice_id is not KEEP_VOICE:
                changes["voice_id"] = voice_id
            conn.execute(cast_members.update().where(this).values(**changes))

    def delete_cast_member(self, session_id: str, character_id: str) -> None:
        """Remove a member; its lines go back to the scene's first character, its takes stay as they are."""
        with self._transaction() as conn:
            conn.execute(cast_members.delete().where(cast_members.c.session_id == session_id,
                                                     cast_members.c.character_id == character_id))
            conn.execute(lines.update().where(lines.c.session_id == session_id, lines.c.character_id == character_id)
                         .values(character_id=None))
            rest = self._cast(conn, session_id)
            for place, member in enumerate(rest):
                conn.execute(cast_members.update().where(cast_members.c.session_id == session_id,
                                                         cast_members.c.character_id == member.character_id)
                             .values(position=place))

    def set_line_character(self, session_id: str, line_id: str, character_id: str | None) -> None:
        """Give a line of the script to a member (None: the scene's first character)."""
        with self._transaction() as conn:
            conn.execute(lines.update().where(lines.c.session_id == session_id, lines.c.line_id == line_id)
                         .values(character_id=character_id))

    def line_character(self, session_id: str, line_id: str) -> CastMember | None:
        """The member who says the line: its own, else the scene's first; None without a cast."""
        with self._transaction() as conn:
            cast = self._cast(conn, session_id)
            if not cast:  # (most scenes: one statement before every take, not two)
                return None
            chosen = conn.execute(sa.select(lines.c.character_id).where(
                lines.c.session_id == session_id, lines.c.line_id == line_id)).scalar_one_or_none()
        return next((m for m in cast if m.character_id == chosen), cast[0] if cast else None)

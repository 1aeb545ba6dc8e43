"""What the store keeps of a scene beyond its script, voices and takes: its name and dates, its
cast, and each take's note and rating; and the scene as a whole (listed, renamed, duplicated,
deleted and restored). `Store` (backend/store.py) has these methods through `SceneRecords`.

Design choices:
- A cast member is a row of `cast_members`: an id the client chose (as for lines), a name, a
  voice (a row of `voices`, the session's like any other; NULL is the engine's default voice)
  and a place in the cast. The first member (position 0) says every line not given to
  another (`lines.character_id` NULL), so a scene with a cast never has a line without a voice.
- A member's voice is replaced, never edited: a new `voices` row each time, so the takes that
  spoke with the old one still name it (`takes.voice_id`).
- Removing a member frees its lines (they go back to the scene's first character); its takes
  keep their `character_id` and `voice_id`.
- A scene is a session. Its `updated_ms` is touched by every change the director makes
  (backend/directing/session.py touches it after each handled message); deleting it sets
  `deleted_ms` and keeps everything, so it can be restored; a deleted scene does not open.
- Duplicating copies everything a director made (script, cast and voices, ended takes with their
  codes, audio, notes and kept flags), giving the copies new take and voice ids and mapping the
  takes' histories to them; takes still queued or running are not copied.
- Every method is one transaction, like the rest of the store.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backend.schema import cast_members, lines, sessions, take_audio, takes, voice_references, voices


@dataclass(frozen=True)
class SceneSummary:
    """A scene in the list: its name, dates and size."""

    session_id: str
    name: str
    created_ms: int
    updated_ms: int  # the last change (created_ms if none)
    deleted_ms: int | None
    lines: int
    takes: int
    kept: int  # kept takes of the script
    kept_samples: int  # their total length: the scene's duration


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class CastMember:
    character_id: str
    name: str
    voice_id: int | None  # None: the engine's default voice
    position: int


KEEP_VOICE: Any = object()  # set_cast_member's `voice_id` when a member keeps its voice


class SceneRecords:
    """The cast and the notes (a part of Store)."""

    def _transaction(self) -> Any:
        raise NotImplementedError  # Store's

    # The cast ---------------------------------------------------------------------

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
            chosen = conn.execute(sa.select(lines.c.character_id).where(
                lines.c.session_id == session_id, lines.c.line_id == line_id)).scalar_one_or_none()
        return next((m for m in cast if m.character_id == chosen), cast[0] if cast else None)

    # The scene ---------------------------------------------------------------------

    def scene_name(self, session_id: str) -> str:
        with self._transaction() as conn:
            name = conn.execute(sa.select(sessions.c.name).where(sessions.c.session_id == session_id)
                                ).scalar_one_or_none()
        return name or ""

    def touch(self, session_id: str) -> None:
        """The director changed the scene now."""
        with self._transaction() as conn:
            conn.execute(sessions.update().where(sessions.c.session_id == session_id).values(updated_ms=now_ms()))

    def scenes(self, session_ids: list[str]) -> list[SceneSummary]:
        """These scenes (those that exist, deleted ones too), the last changed first."""
        if not session_ids:
            return []
        live = sa.and_(lines.c.session_id == sessions.c.session_id, lines.c.deleted_ms.is_(None))
        line_count = sa.select(sa.func.count()).select_from(lines).where(live).scalar_subquery()
        take_count = sa.select(sa.func.count()).select_from(takes).where(
            takes.c.session_id == sessions.c.session_id).scalar_subquery()
        def kept(column: Any) -> Any:  # over the kept takes of the script's lines
            return (sa.select(column).select_from(takes)
                    .join(lines, sa.and_(lines.c.session_id == takes.c.session_id, lines.c.line_id == takes.c.line_id))
                    .where(takes.c.session_id == sessions.c.session_id, takes.c.kept, lines.c.deleted_ms.is_(None))
                    .scalar_subquery())
        last_take = sa.select(sa.func.max(takes.c.created_ms)).where(
            takes.c.session_id == sessions.c.session_id).scalar_subquery()
        with self._transaction() as conn:
            rows = conn.execute(sa.select(
                sessions.c.session_id, sessions.c.name, sessions.c.created_ms, sessions.c.updated_ms,
                sessions.c.deleted_ms, line_count.label("lines"), take_count.label("takes"),
                last_take.label("last_take"),
                kept(sa.func.count()).label("kept"),
                kept(sa.func.coalesce(sa.func.sum(takes.c.samples), 0)).label("kept_samples"),
            ).where(sessions.c.session_id.in_(session_ids))).all()
        summaries = [SceneSummary(r.session_id, r.name or "", int(r.created_ms),
                                  max(int(r.created_ms), int(r.updated_ms or 0), int(r.last_take or 0)),
                                  r.deleted_ms, int(r.lines), int(r.takes), int(r.kept), int(r.kept_samples))
                     for r in rows]
        return sorted(summaries, key=lambda s: (-s.updated_ms, s.session_id))

    def rename_scene(self, session_id: str, name: str) -> None:
        with self._transaction() as conn:
            conn.execute(sessions.update().where(sessions.c.session_id == session_id)
                         .values(name=name or None, updated_ms=now_ms()))

    def delete_scene(self, session_id: str, deleted: bool = True) -> None:
        """Delete the scene (nothing is removed: it can be restored), or restore it."""
        with self._transaction() as conn:
            conn.execute(sessions.update().where(sessions.c.session_id == session_id)
                         .values(deleted_ms=now_ms() if deleted else None))

    def scene_deleted(self, session_id: str) -> bool:
        with self._transaction() as conn:
            return conn.execute(sa.select(sessions.c.deleted_ms).where(sessions.c.session_id == session_id)
                                ).scalar_one_or_none() is not None

    def duplicate_scene(self, session_id: str, new_id: str, name: str) -> None:
        """Copy the scene into the new, empty session `new_id` (see the module's design choices)."""
        with self._transaction() as conn:
            source = conn.execute(sa.select(sessions).where(sessions.c.session_id == session_id)).one()
            voice_ids: dict[int, int] = {}
            for voice in conn.execute(sa.select(voices).where(voices.c.session_id == session_id)
                                      .order_by(voices.c.voice_id)).all():
                key = conn.execute(voices.insert().values(session_id=new_id, character=voice.character,
                                                          created_ms=voice.created_ms)).inserted_primary_key
                assert key is not None
                voice_ids[voice.voice_id] = int(key[0])
                clips = conn.execute(sa.select(voice_references).where(voice_references.c.voice_id == voice.voice_id))
                for clip in clips.all():
                    conn.execute(voice_references.insert().values(
                        voice_id=voice_ids[voice.voice_id], idx=clip.idx, text=clip.text, codebooks=clip.codebooks,
                        codes=clip.codes))
            conn.execute(sessions.update().where(sessions.c.session_id == new_id).values(
                name=name, voice_id=voice_ids.get(source.voice_id), updated_ms=now_ms()))
            for line in conn.execute(sa.select(lines).where(lines.c.session_id == session_id)).all():
                conn.execute(lines.insert().values(session_id=new_id, line_id=line.line_id, text=line.text,
                                                   position=line.position, deleted_ms=line.deleted_ms,
                                                   character_id=line.character_id))
            for member in conn.execute(sa.select(cast_members).where(cast_members.c.session_id == session_id)).all():
                conn.execute(cast_members.insert().values(
                    session_id=new_id, character_id=member.character_id, name=member.name,
                    voice_id=voice_ids.get(member.voice_id), position=member.position))
            take_ids: dict[int, int] = {}
            copied = conn.execute(sa.select(takes).where(takes.c.session_id == session_id, takes.c.state == "done")
                                  .order_by(takes.c.take_id)).all()
            for take in copied:
                values = {c.name: getattr(take, c.name) for c in takes.columns if c.name not in ("take_id", "replica")}
                values.update(session_id=new_id, voice_id=voice_ids.get(take.voice_id))
                key = conn.execute(takes.insert().values(**values)).inserted_primary_key
                assert key is not None
                take_ids[take.take_id] = int(key[0])
                audio = conn.execute(sa.select(take_audio).where(take_audio.c.take_id == take.take_id)).first()
                if audio is not None:
                    conn.execute(take_audio.insert().values(take_id=take_ids[take.take_id],
                                                            sample_rate=audio.sample_rate, pcm=audio.pcm))
            for take in copied:  # the histories name the copies
                history = [take_ids[t] for t in json.loads(take.history) if t in take_ids]
                conn.execute(takes.update().where(takes.c.take_id == take_ids[take.take_id])
                             .values(history=json.dumps(history)))

    # Notes and ratings ------------------------------------------------------------

    def set_note(self, take_id: int, note: str | None, rating: int | None) -> tuple[str, int]:
        """Change the take's note and/or rating (None: unchanged; "" and 0 clear); returns both as stored."""
        changes: dict[str, Any] = {}
        if note is not None:
            changes["note"] = note or None
        if rating is not None:
            changes["rating"] = rating or None
        with self._transaction() as conn:
            if changes:
                conn.execute(takes.update().where(takes.c.take_id == take_id).values(**changes))
            row = conn.execute(sa.select(takes.c.note, takes.c.rating).where(takes.c.take_id == take_id)).one()
        return row.note or "", row.rating or 0

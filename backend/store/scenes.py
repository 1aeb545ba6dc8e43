"""The store's scenes as wholes: listed, named, touched, deleted and restored, duplicated.

Design choices:
- A scene is a session. Its `updated_ms` is touched by every change the director makes
  (backend/directing/session.py touches it after each handled message); deleting it sets
  `deleted_ms` and keeps everything, so it can be restored; a deleted scene does not open.
- Duplicating copies everything a director made (script, cast and voices, ended takes with their
  codes, audio, notes and kept flags), giving the copies new take and voice ids and mapping the
  takes' histories to them; takes still queued or running are not copied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from backend.schema import cast_members, lines, sessions, take_audio, takes, voice_references, voices
from backend.store.rows import Part, now_ms


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


class Scenes(Part):
    """Scenes as wholes (a part of Store)."""

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
                dropped = [take_ids[t] for t in json.loads(take.dropped or "[]") if t in take_ids]
                conn.execute(takes.update().where(takes.c.take_id == take_ids[take.take_id])
                             .values(history=json.dumps(history), dropped=json.dumps(dropped) if dropped else None))

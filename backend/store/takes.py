"""The store's takes: queued, running (their windows), finished (codes and audio), kept, noted.

Design choices:
- Take ids come from one sequence over all sessions (and all replicas), so an id names one
  take on the whole deployment (the audio frame header carries it as u32).
- A running take's windows are written (their codes) as they stream, before they are sent;
  the take's codes replace them when it finishes.
- Takes that a replica left queued or running when it died are finished as `error`, with the
  codes of the windows they had sent, so the audio a director heard before a crash is kept: on
  open (every dead replica's), and when a session is resumed (`finish_orphaned_takes`). Which
  replica is alive is backend/replicas.py's question.
- A finished take keeps the audio that streamed (`take_audio`), so playing and exporting it
  never need the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from backend.directing.protocol import FinishReason, SamplingInfo, TakeInfo, TakeState
from backend.schema import lines, take_audio, take_windows, takes
from backend.store.rows import Part, blob_to_codes, codes_to_blob, live, now_ms, upsert

STOPPED_DURING_TAKE = "the server stopped during this take"


def audio_url(session_id: str, take_id: int) -> str:
    return f"/sessions/{session_id}/takes/{take_id}.wav"


@dataclass(frozen=True)
class StoredTake:
    take_id: int
    session_id: str
    line_id: str
    text: str
    voice_id: int | None
    sampling: SamplingInfo
    history: list[int]
    kept: bool
    state: TakeState
    finish_reason: FinishReason | None
    error: str | None
    timings: dict[str, float | int | None]
    frames: int
    samples: int
    attempts: int
    created_ms: int
    character_id: str | None = None
    note: str = ""
    rating: int = 0
    guard_frames: int | None = None
    dropped: list[int] = field(default_factory=list)  # history left out to fit the prompt

    @property
    def usable(self) -> bool:
        """Whether the take has audio to keep or to condition on: any finished take with frames,
        whatever ended it (a take the server was stopped during keeps the frames it sent, and
        exports them)."""
        return self.state == "done" and self.frames > 0

    def info(self) -> TakeInfo:
        return {
            "take_id": self.take_id, "line_id": self.line_id, "text": self.text, "voice_id": self.voice_id,
            "sampling": self.sampling, "history": self.history, "kept": self.kept, "state": self.state,
            "finish_reason": self.finish_reason, "error": self.error, "timings": self.timings,
            "frames": self.frames, "samples": self.samples, "attempts": self.attempts,
            "audio_url": audio_url(self.session_id, self.take_id), "created_ms": self.created_ms,
            "character_id": self.character_id, "note": self.note, "rating": self.rating,
            "guard_frames": self.guard_frames, "dropped": self.dropped,
        }


TAKE_COLUMNS = (takes.c.take_id, takes.c.session_id, takes.c.line_id, takes.c.text, takes.c.voice_id,
                takes.c.sampling, takes.c.history, takes.c.kept, takes.c.state, takes.c.finish_reason, takes.c.error,
                takes.c.timings, takes.c.frames, takes.c.samples, takes.c.attempts, takes.c.created_ms,
                takes.c.character_id, takes.c.note, takes.c.rating, takes.c.guard_frames, takes.c.dropped)


def _take(row: Row[Any]) -> StoredTake:
    return StoredTake(
        take_id=row.take_id, session_id=row.session_id, line_id=row.line_id, text=row.text,
        voice_id=row.voice_id, sampling=cast(SamplingInfo, json.loads(row.sampling)),
        history=json.loads(row.history), kept=bool(row.kept), state=row.state,
        finish_reason=row.finish_reason, error=row.error, timings=json.loads(row.timings),
        frames=row.frames, samples=row.samples, attempts=row.attempts, created_ms=row.created_ms,
        character_id=row.character_id, note=row.note or "", rating=row.rating or 0, guard_frames=row.guard_frames,
        dropped=json.loads(row.dropped) if row.dropped else [],
    )


class Takes(Part):
    """Takes from queued to finished, and which are kept (a part of Store)."""

    def add_take(self, session_id: str, line_id: str, text: str, voice_id: int | None,
                 sampling: SamplingInfo, *, character_id: str | None = None,
                 guard_frames: int | None = None) -> StoredTake:
        """A queued take (of this replica). Its line takes the take's text; a line not in the
        script (new, or deleted) goes last."""
        with self._transaction() as conn:
            last = sa.select(sa.func.count()).select_from(lines).where(live(session_id)).scalar_subquery()
            insert = upsert(conn, lines).values(session_id=session_id, line_id=line_id, text=text, position=last)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[lines.c.session_id, lines.c.line_id],
                set_={"text": insert.excluded.text, "deleted_ms": None,
                      "position": sa.case((lines.c.deleted_ms.is_(None), lines.c.position),
                                          else_=insert.excluded.position)}))
            row = conn.execute(takes.insert().values(
                session_id=session_id, line_id=line_id, text=text, voice_id=voice_id, sampling=json.dumps(sampling),
                created_ms=now_ms(), replica=self.replica.id, character_id=character_id,
                guard_frames=guard_frames).returning(*TAKE_COLUMNS)).one()  # (no read back after it)
        return _take(row)

    def take(self, session_id: str, take_id: int) -> StoredTake | None:
        """The take if it belongs to this session (another session's take is as good as unknown)."""
        return self.takes_by_id(session_id, [take_id]).get(take_id)

    def takes_by_id(self, session_id: str, take_ids: list[int]) -> dict[int, StoredTake]:
        """Those of the takes that belong to this session, by id, in one query (a take's history)."""
        if not take_ids:
            return {}
        with self._transaction() as conn:
            rows = conn.execute(sa.select(*TAKE_COLUMNS).where(takes.c.session_id == session_id,
                                                              takes.c.take_id.in_(take_ids))).all()
        return {int(row.take_id): _take(row) for row in rows}

    def kept_lines(self, session_id: str) -> dict[int, str]:
        """The session's kept takes and their lines (take id -> line id), in one light query (a keep
        asks, and did read every take of the session)."""
        with self._transaction() as conn:
            rows = conn.execute(sa.select(takes.c.take_id, takes.c.line_id)
                                .where(takes.c.session_id == session_id, takes.c.kept)).all()
        return {int(row.take_id): str(row.line_id) for row in rows}

    def takes(self, session_id: str) -> list[StoredTake]:
        with self._transaction() as conn:
            rows = conn.execute(sa.select(*TAKE_COLUMNS).where(takes.c.session_id == session_id)
                                .order_by(takes.c.take_id)).all()
        return [_take(r) for r in rows]

    def count_takes(self, session_id: str) -> int:
        with self._transaction() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(takes)
                                    .where(takes.c.session_id == session_id)).scalar_one())

    def start_take(self, take_id: int, attempt: int, sampling: SamplingInfo) -> None:
        with self._transaction() as conn:
            conn.execute(take_windows.delete().where(take_windows.c.take_id == take_id))  # an earlier attempt's
            conn.execute(takes.update().where(takes.c.take_id == take_id).values(
                state="running", attempts=attempt, sampling=json.dumps(sampling)))

    def add_take_window(self, take_id: int, seq: int, codes: np.ndarray, samples: int) -> None:
        """A running take's window (its new frames' codes [codebooks, frames]), before it is sent."""
        codebooks, blob = codes_to_blob(codes)
        with self._transaction() as conn:
            insert = upsert(conn, take_windows).values(take_id=take_id, seq=seq, codebooks=codebooks, codes=blob,
                                                       samples=samples)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[take_windows.c.take_id, take_windows.c.seq],
                set_={"codebooks": insert.excluded.codebooks, "codes": insert.excluded.codes,
                      "samples": insert.excluded.samples}))

    def set_history(self, take_id: int, history: list[int], dropped: list[int] | None = None) -> None:
        """The takes the take heard, and those of its history left out to fit the prompt."""
        with self._transaction() as conn:
            conn.execute(takes.update().where(takes.c.take_id == take_id).values(
                history=json.dumps(history), dropped=json.dumps(dropped) if dropped else None))

    def finish_take(self, take_id: int, finish_reason: FinishReason, *, error: str | None,
                    timings: dict[str, float | int | None], samples: int, attempts: int,
                    codes: np.ndarray | None, pcm: np.ndarray | None = None, sample_rate: int = 0) -> None:
        """The take ended; `pcm` (int16 [samples], at `sample_rate`) is the audio that streamed, kept
        with it so that playing and exporting it never need the engine."""
        with self._transaction() as conn:
            self._finish(conn, take_id, finish_reason, error=error, timings=timings, samples=samples,
                         attempts=attempts, codes=codes)
            if pcm is not None and len(pcm) > 0:
                conn.execute(take_audio.insert().values(
                    take_id=take_id, sample_rate=sample_rate, pcm=np.ascontiguousarray(pcm, dtype="<i2").tobytes()))

    @staticmethod
    def _finish(conn: Connection, take_id: int, finish_reason: FinishReason, *, error: str | None,
                timings: dict[str, float | int | None], samples: int, attempts: int,
                codes: np.ndarray | None) -> None:
        codebooks, blob = (None, None) if codes is None else codes_to_blob(codes)
        frames = 0 if codes is None else int(codes.shape[1])
        conn.execute(takes.update().where(takes.c.take_id == take_id).values(
            state="done", finish_reason=finish_reason, error=error, timings=json.dumps(timings), frames=frames,
            samples=samples, attempts=attempts, codebooks=codebooks, codes=blob))
        conn.execute(take_windows.delete().where(take_windows.c.take_id == take_id))

    def finish_orphaned_takes(self, session_id: str | None = None) -> int:
        """Finish the takes that dead replicas left queued or running (of one session, or all),
        each with the windows it had sent; returns how many. Takes of live replicas stay."""
        finished = 0
        with self._transaction() as conn:
            unfinished = sa.select(takes.c.replica).distinct().where(takes.c.state != "done")
            if session_id is not None:
                unfinished = unfinished.where(takes.c.session_id == session_id)
            owners = list(conn.execute(unfinished).scalars())
        for owner in owners:
            with self._transaction() as conn:
                if self.replica.alive(conn, owner):
                    continue
                orphaned = sa.select(takes.c.take_id, takes.c.attempts, takes.c.timings).where(
                    takes.c.state != "done", takes.c.replica.is_(None) if owner is None else takes.c.replica == owner)
                if session_id is not None:
                    orphaned = orphaned.where(takes.c.session_id == session_id)
                for take_id, attempts, timings in conn.execute(orphaned).all():
                    windows = conn.execute(
                        sa.select(take_windows.c.codebooks, take_windows.c.codes, take_windows.c.samples)
                        .where(take_windows.c.take_id == take_id).order_by(take_windows.c.seq)).all()
                    codes = np.concatenate([blob_to_codes(w.codebooks, w.codes) for w in windows], axis=1) \
                        if windows else None
                    self._finish(conn, take_id, "error", error=STOPPED_DURING_TAKE,
                                 timings=json.loads(timings or "{}"), samples=sum(int(w.samples) for w in windows),
                                 attempts=attempts, codes=codes)
                    finished += 1
            if owner is not None and session_id is None:
                self.replica.forget(owner)
        return finished

    def takes_elsewhere(self, session_id: str) -> list[int]:
        """The session's takes that another replica has queued or running."""
        with self._transaction() as conn:
            return list(conn.execute(sa.select(takes.c.take_id).where(
                takes.c.session_id == session_id, takes.c.state != "done",
                sa.or_(takes.c.replica.is_(None), takes.c.replica != self.replica.id))
                .order_by(takes.c.take_id)).scalars())

    def take_audio(self, take_id: int) -> tuple[np.ndarray, int] | None:
        """The take's kept audio (int16 [samples], sample rate), or None (an older or interrupted take)."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(take_audio.c.pcm, take_audio.c.sample_rate)
                               .where(take_audio.c.take_id == take_id)).first()
        return None if row is None else (np.frombuffer(row.pcm, dtype="<i2").astype(np.int16), int(row.sample_rate))

    def take_codes(self, take_id: int) -> np.ndarray | None:
        return self.takes_codes([take_id]).get(take_id)

    def takes_codes(self, take_ids: list[int]) -> dict[int, np.ndarray]:
        """The codes of those takes that have them, by id, in one query ([codebooks, frames] each)."""
        if not take_ids:
            return {}
        with self._transaction() as conn:
            rows = conn.execute(sa.select(takes.c.take_id, takes.c.codebooks, takes.c.codes)
                                .where(takes.c.take_id.in_(take_ids), takes.c.codes.is_not(None))).all()
        return {int(row.take_id): blob_to_codes(row.codebooks, row.codes) for row in rows}

    def set_kept(self, take_id: int, kept: bool) -> None:
        with self._transaction() as conn:
            conn.execute(takes.update().where(takes.c.take_id == take_id).values(kept=kept))

    def keep(self, take_id: int) -> list[int]:
        """Keep a take and un-keep its line's other kept takes, in one transaction (a crash
        between the two leaves neither a line with two kept takes nor one with none); the
        takes un-kept, by id."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(takes.c.session_id, takes.c.line_id)
                               .where(takes.c.take_id == take_id)).one()
            rivals = [int(other) for other in conn.execute(
                sa.select(takes.c.take_id).where(takes.c.session_id == row.session_id,
                                                 takes.c.line_id == row.line_id, takes.c.kept,
                                                 takes.c.take_id != take_id)
                .order_by(takes.c.take_id)).scalars()]
            conn.execute(takes.update().where(takes.c.take_id.in_([take_id, *rivals]))
                         .values(kept=takes.c.take_id == take_id))
        return rivals

    def kept_history(self, session_id: str, line_id: str | None = None) -> list[int]:
        """The kept takes of the script in script order (by line, then take id): all of them, or,
        given a line of the script, those of the lines above it (what a take of that line hears).
        Takes of deleted lines are never in it."""
        # Past every line: a line not in the script (new, or deleted) hears them all.
        end: int | sa.ColumnElement[Any] = 2**31 - 1
        if line_id is not None:  # (a subquery: one statement before every take, not two)
            position = sa.select(lines.c.position).where(live(session_id), lines.c.line_id == line_id)
            end = sa.func.coalesce(position.scalar_subquery(), end)
        with self._transaction() as conn:
            rows = conn.execute(
                sa.select(takes.c.take_id)
                .join(lines, sa.and_(lines.c.session_id == takes.c.session_id, lines.c.line_id == takes.c.line_id))
                .where(takes.c.session_id == session_id, takes.c.kept, lines.c.deleted_ms.is_(None),
                       lines.c.position < end)
                .order_by(lines.c.position, takes.c.take_id))
            return [int(take_id) for take_id in rows.scalars()]

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

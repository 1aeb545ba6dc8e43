"""Persistence of directing sessions: sessions, lines, voices (codes) and takes (codes), in SQLite
(the embedded default) or PostgreSQL (replicas sharing one database), through backend/schema.py.

Design choices:
- One SQLite file (`retake.sqlite3` under `--data-dir`) or one PostgreSQL database
  (`--database postgresql://...`), used by the server from one store thread
  (backend/store_thread.py), never from the event loop: a frozen or full disk then holds up
  only the calls waiting for it. Every write is one short transaction; the store thread runs
  them in the order they were asked for, which keeps "written before announced" a matter of
  order in the caller.
- A committed write survives the process dying (SQLite: WAL with synchronous=NORMAL; only a
  power cut can lose the last transactions. PostgreSQL: its own durability).
- Codes are stored as little-endian int32 bytes with their codebook count; the store knows
  numpy arrays, not torch tensors.
- Take ids come from one sequence over all sessions (and all replicas), so an id names one
  take on the whole deployment (the audio frame header carries it as u32).
- A running take's windows are written (their codes) as they stream, before they are sent;
  the take's codes replace them when it finishes. Takes that a replica left queued or
  running when it died are finished as `error`, with the codes of the windows they had sent,
  so the audio a director heard before a crash is kept: on open (every dead replica's), and
  when a session is resumed (`finish_orphaned_takes`). Which replica is alive is
  backend/replicas.py's question.
- A session is opened with its key (backend/directing/session.py), not its id alone: the
  id is in export URLs and access logs. The store keeps only the key's SHA-256; a session
  stored before keys existed has none until the first socket that resumes it claims one.
- The script: `lines.position` is a line's place (0, 1, ... over the lines not deleted),
  rewritten whenever the order changes (a script is at most a thousand short rows). A deleted
  line without takes is gone; one with takes stays, marked with `deleted_ms`, so its takes keep
  their line, and setting that line again brings it back with its takes.
- Saved voices (`saved_voices`, `saved_voice_clips`) are the server's, not a session's: their
  clips are kept as uploaded (WAV or FLAC bytes, so they outlive a checkpoint), with their
  transcripts; a session that uses one stores its own copy as codes, like any voice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Row

from backend import replicas, schema
from backend.directing.protocol import (
    CharacterInfo,
    CharacterSpec,
    FinishReason,
    LineInfo,
    SamplingInfo,
    TakeInfo,
    TakeState,
    VoiceInfo,
)
from backend.scene_store import SceneRecords
from backend.schema import (
    NewerSchema,
    Unreachable,
    lines,
    saved_voice_clips,
    saved_voices,
    sessions,
    take_audio,
    take_windows,
    takes,
    voice_references,
    voices,
)

__all__ = ["STOPPED_DURING_TAKE", "NewerSchema", "SavedVoice", "Store", "StoredReference", "StoredTake", "StoredVoice",
           "Unreachable", "audio_url", "check_schema"]
STOPPED_DURING_TAKE = "the server stopped during this take"


def describe(database: Path | str) -> str:
    """The database as messages name it (as given, but never with its password)."""
    if isinstance(database, Path) or schema.database_url(database).password is None:
        return str(database)
    return sa.make_url(database).render_as_string(hide_password=True)


def one_line(error: sa.exc.DBAPIError) -> str:
    """The driver's message (libpq's spans lines) on one line."""
    return " ".join(str(error.orig).split())


def check_schema(database: Path | str) -> None:
    """Raise NewerSchema if the database is from a newer Retake, Unreachable if it cannot be
    opened; changes nothing (a SQLite file that does not exist yet is fine)."""
    if isinstance(database, Path) and not database.is_file():
        return
    engine = schema.connect(database)
    try:
        with engine.connect() as conn:
            schema.check(conn, describe(database))
    except sa.exc.DBAPIError as error:
        raise Unreachable(f"cannot open {describe(database)}: {one_line(error)}") from None
    finally:
        engine.dispose()


SessionKey = Literal["ok", "unknown", "unclaimed"]


def key_hash(key: str) -> str:
    """What the store keeps of a session key (keys are 256 random bits: a plain hash is enough)."""
    return hashlib.sha256(key.encode()).hexdigest()


def now_ms() -> int:
    return int(time.time() * 1000)


def audio_url(session_id: str, take_id: int) -> str:
    return f"/sessions/{session_id}/takes/{take_id}.wav"


def codes_to_blob(codes: np.ndarray) -> tuple[int, bytes]:
    if codes.ndim != 2:
        raise ValueError(f"codes must be [codebooks, frames]; got shape {codes.shape}")
    return codes.shape[0], np.ascontiguousarray(codes, dtype="<i4").tobytes()


def blob_to_codes(codebooks: int, blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i4").astype(np.int64).reshape(codebooks, -1)  # [codebooks, frames]


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

    @property
    def usable(self) -> bool:
        """Whether the take has audio to keep or to condition on."""
        return self.state == "done" and self.finish_reason != "error" and self.frames > 0

    def info(self) -> TakeInfo:
        return {
            "take_id": self.take_id, "line_id": self.line_id, "text": self.text, "voice_id": self.voice_id,
            "sampling": self.sampling, "history": self.history, "kept": self.kept, "state": self.state,
            "finish_reason": self.finish_reason, "error": self.error, "timings": self.timings,
            "frames": self.frames, "samples": self.samples, "attempts": self.attempts,
            "audio_url": audio_url(self.session_id, self.take_id), "created_ms": self.created_ms,
            "character_id": self.character_id, "note": self.note, "rating": self.rating,
            "guard_frames": self.guard_frames,
        }


TAKE_COLUMNS = (takes.c.take_id, takes.c.session_id, takes.c.line_id, takes.c.text, takes.c.voice_id,
                takes.c.sampling, takes.c.history, takes.c.kept, takes.c.state, takes.c.finish_reason, takes.c.error,
                takes.c.timings, takes.c.frames, takes.c.samples, takes.c.attempts, takes.c.created_ms,
                takes.c.character_id, takes.c.note, takes.c.rating, takes.c.guard_frames)
SCRIPT = (lines.c.position, lines.c.line_id)  # the script's order (positions are unique; the id is a tiebreak)


def _take(row: Row[Any]) -> StoredTake:
    return StoredTake(
        take_id=row.take_id, session_id=row.session_id, line_id=row.line_id, text=row.text,
        voice_id=row.voice_id, sampling=cast(SamplingInfo, json.loads(row.sampling)),
        history=json.loads(row.history), kept=bool(row.kept), state=row.state,
        finish_reason=row.finish_reason, error=row.error, timings=json.loads(row.timings),
        frames=row.frames, samples=row.samples, attempts=row.attempts, created_ms=row.created_ms,
        character_id=row.character_id, note=row.note or "", rating=row.rating or 0, guard_frames=row.guard_frames,
    )


def _upsert(conn: Connection, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT for this database (both dialects spell it the same way)."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


def _live(session_id: str) -> sa.ColumnElement[bool]:
    """The session's lines that are in the script (not deleted)."""
    return sa.and_(lines.c.session_id == session_id, lines.c.deleted_ms.is_(None))


class Store(SceneRecords):
    """The session store; every method is one transaction, committed when it returns. The cast
    and the notes are in backend/scene_store.py.

    `database`: a SQLite file (Path) or a database URL (str, `postgresql://user@host/db`)."""

    def __init__(self, database: Path | str) -> None:
        self.name = describe(database)
        self.engine = schema.connect(database)
        try:
            schema.migrate(self.engine, self.name)
            self.replica = replicas.claim(self.engine)
        except sa.exc.DBAPIError as error:
            self.engine.dispose()
            raise Unreachable(f"cannot open {self.name}: {one_line(error)}") from None
        except BaseException:
            self.engine.dispose()
            raise
        self.interrupted = self.finish_orphaned_takes()

    def close(self) -> None:
        self.replica.close()
        self.engine.dispose()

    def _transaction(self) -> Any:
        """The statements inside as one transaction (committed at the end, rolled back on an exception)."""
        return self.engine.begin()

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

    # Sessions -----------------------------------------------------------------

    def create_session(self) -> str:
        session_id = secrets.token_hex(16)
        with self._transaction() as conn:
            conn.execute(sessions.insert().values(session_id=session_id, created_ms=now_ms()))
        return session_id

    def new_session_key(self, session_id: str, *, unclaimed: bool = False) -> str | None:
        """Give the session a new key (the old one stops opening it); returns the key, which only
        its hash is stored of. With `unclaimed`, only if the session has no key yet (else None)."""
        key = secrets.token_urlsafe(32)
        update = sessions.update().where(sessions.c.session_id == session_id)
        if unclaimed:
            update = update.where(sessions.c.key_hash.is_(None))
        with self._transaction() as conn:
            changed = conn.execute(update.values(key_hash=key_hash(key))).rowcount
        return key if changed else None

    def session_key(self, session_id: str, key: str | None) -> SessionKey:
        """Whether `key` opens the session: "ok", "unknown" (no such session, or another key; the
        two look the same), or "unclaimed" (a session stored before keys, which has none)."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(sessions.c.key_hash).where(sessions.c.session_id == session_id)).first()
        if row is None:
            return "unknown"
        if row.key_hash is None:
            return "unclaimed"
        given = key_hash(key or "")
        return "ok" if key is not None and hmac.compare_digest(given, row.key_hash) else "unknown"

    def has_session(self, session_id: str) -> bool:
        with self._transaction() as conn:
            return conn.execute(sa.select(sessions.c.session_id).where(
                sessions.c.session_id == session_id)).first() is not None

    # The script ---------------------------------------------------------------

    def lines(self, session_id: str) -> list[LineInfo]:
        """The script in order (deleted lines left out)."""
        with self._transaction() as conn:
            rows = conn.execute(sa.select(lines.c.line_id, lines.c.text, lines.c.character_id).where(_live(session_id))
                                .order_by(*SCRIPT)).all()
        return [{"line_id": r.line_id, "text": r.text, "position": k, "character_id": r.character_id}
                for k, r in enumerate(rows)]

    def line_ids(self, session_id: str) -> list[str]:
        return [line["line_id"] for line in self.lines(session_id)]

    @staticmethod
    def _place(conn: Connection, session_id: str, order: list[str]) -> None:
        if order:
            conn.execute(lines.update().where(lines.c.session_id == session_id,
                                              lines.c.line_id == sa.bindparam("line"))
                         .values(position=sa.bindparam("place")),
                         [{"line": line_id, "place": k} for k, line_id in enumerate(order)])

    def set_line(self, session_id: str, line_id: str, text: str, *, after: str | None = None,
                 place: bool = False) -> None:
        """Create the line (or bring a deleted one back) and set its text. With `place` the line
        goes after `after` (None: first); without, a line new to the script goes last and one in
        it stays. `after` must be another line of the script (the caller checks)."""
        order = self.line_ids(session_id)
        moves = place or line_id not in order  # else a text edit: the order stands
        if moves:
            rest = [i for i in order if i != line_id]
            at = len(rest) if not place else 0 if after is None else rest.index(after) + 1
            order = [*rest[:at], line_id, *rest[at:]]
        with self._transaction() as conn:
            insert = _upsert(conn, lines).values(session_id=session_id, line_id=line_id, text=text, position=-1)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[lines.c.session_id, lines.c.line_id],
                set_={"text": insert.excluded.text, "deleted_ms": None}))
            if moves:
                self._place(conn, session_id, order)

    def delete_line(self, session_id: str, line_id: str) -> None:
        """Take the line out of the script: gone if it has no takes, else kept aside with them."""
        with self._transaction() as conn:
            this = sa.and_(lines.c.session_id == session_id, lines.c.line_id == line_id)
            has_takes = conn.execute(sa.select(takes.c.take_id).where(
                takes.c.session_id == session_id, takes.c.line_id == line_id).limit(1)).first() is not None
            if has_takes:
                conn.execute(lines.update().where(this).values(deleted_ms=now_ms(), position=-1))
            else:
                conn.execute(lines.delete().where(this))
            rest = list(conn.execute(sa.select(lines.c.line_id).where(_live(session_id)).order_by(*SCRIPT)).scalars())
            self._place(conn, session_id, rest)

    def set_order(self, session_id: str, order: list[str]) -> None:
        """`order` lists every line of the script once (the caller checks)."""
        with self._transaction() as conn:
            self._place(conn, session_id, order)

    def takes(self, session_id: str) -> list[StoredTake]:
        with self._transaction() as conn:
            rows = conn.execute(sa.select(*TAKE_COLUMNS).where(takes.c.session_id == session_id)
                                .order_by(takes.c.take_id)).all()
        return [_take(r) for r in rows]

    def count_takes(self, session_id: str) -> int:
        with self._transaction() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(takes)
                                    .where(takes.c.session_id == session_id)).scalar_one())

    # Voices -------------------------------------------------------------------

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
        spec = None if character is None else json.dumps(
            {"name": character.name, "description": character.description, "scene": character.scene})
        key = conn.execute(voices.insert().values(session_id=session_id, character=spec,
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
        character = None if row.character is None else CharacterSpec(**json.loads(row.character))
        return StoredVoice(voice_id, references, character)

    # Saved voices ---------------------------------------------------------------

    def save_voice(self, name: str, clips: list[tuple[bytes, str]], character: CharacterSpec | None,
                   consent: str | None) -> SavedVoice | None:
        """Save a voice under a new name (None: the name is taken)."""
        voice_id, created = f"voice_{secrets.token_hex(8)}", now_ms()
        spec = None if character is None else json.dumps(
            {"name": character.name, "description": character.description, "scene": character.scene})
        try:
            with self._transaction() as conn:
                conn.execute(saved_voices.insert().values(voice_id=voice_id, name=name, character=spec,
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
        character = None if row.character is None else CharacterSpec(**json.loads(row.character))
        return SavedVoice(row.voice_id, row.name, int(row.created_ms), [c.text for c in clips],
                          [bytes(c.audio) for c in clips] if with_audio else [], character, row.consent)

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

    # Takes --------------------------------------------------------------------

    def add_take(self, session_id: str, line_id: str, text: str, voice_id: int | None,
                 sampling: SamplingInfo, *, character_id: str | None = None,
                 guard_frames: int | None = None) -> StoredTake:
        """A queued take (of this replica). Its line takes the take's text; a line not in the
        script (new, or deleted) goes last."""
        with self._transaction() as conn:
            last = sa.select(sa.func.count()).select_from(lines).where(_live(session_id)).scalar_subquery()
            insert = _upsert(conn, lines).values(session_id=session_id, line_id=line_id, text=text, position=last)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[lines.c.session_id, lines.c.line_id],
                set_={"text": insert.excluded.text, "deleted_ms": None,
                      "position": sa.case((lines.c.deleted_ms.is_(None), lines.c.position),
                                          else_=insert.excluded.position)}))
            take_id = conn.execute(takes.insert().values(
                session_id=session_id, line_id=line_id, text=text, voice_id=voice_id, sampling=json.dumps(sampling),
                created_ms=now_ms(), replica=self.replica.id, character_id=character_id,
                guard_frames=guard_frames)).inserted_primary_key[0]
            row = conn.execute(sa.select(*TAKE_COLUMNS).where(takes.c.take_id == take_id)).one()
        return _take(row)

    def take(self, session_id: str, take_id: int) -> StoredTake | None:
        """The take if it belongs to this session (another session's take is as good as unknown)."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(*TAKE_COLUMNS).where(takes.c.take_id == take_id,
                                                              takes.c.session_id == session_id)).first()
        return None if row is None else _take(row)

    def start_take(self, take_id: int, attempt: int, sampling: SamplingInfo) -> None:
        with self._transaction() as conn:
            conn.execute(take_windows.delete().where(take_windows.c.take_id == take_id))  # an earlier attempt's
            conn.execute(takes.update().where(takes.c.take_id == take_id).values(
                state="running", attempts=attempt, sampling=json.dumps(sampling)))

    def add_take_window(self, take_id: int, seq: int, codes: np.ndarray, samples: int) -> None:
        """A running take's window (its new frames' codes [codebooks, frames]), before it is sent."""
        codebooks, blob = codes_to_blob(codes)
        with self._transaction() as conn:
            insert = _upsert(conn, take_windows).values(take_id=take_id, seq=seq, codebooks=codebooks, codes=blob,
                                                        samples=samples)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[take_windows.c.take_id, take_windows.c.seq],
                set_={"codebooks": insert.excluded.codebooks, "codes": insert.excluded.codes,
                      "samples": insert.excluded.samples}))

    def set_history(self, take_id: int, history: list[int]) -> None:
        with self._transaction() as conn:
            conn.execute(takes.update().where(takes.c.take_id == take_id).values(history=json.dumps(history)))

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

    def take_audio(self, take_id: int) -> tuple[np.ndarray, int] | None:
        """The take's kept audio (int16 [samples], sample rate), or None (an older or interrupted take)."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(take_audio.c.pcm, take_audio.c.sample_rate)
                               .where(take_audio.c.take_id == take_id)).first()
        return None if row is None else (np.frombuffer(row.pcm, dtype="<i2").astype(np.int16), int(row.sample_rate))

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

    def take_codes(self, take_id: int) -> np.ndarray | None:
        with self._transaction() as conn:
            row = conn.execute(sa.select(takes.c.codebooks, takes.c.codes).where(takes.c.take_id == take_id)).first()
        if row is None or row.codes is None:
            return None
        return blob_to_codes(row.codebooks, row.codes)

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
        with self._transaction() as conn:
            above = None if line_id is None else conn.execute(
                sa.select(lines.c.position).where(_live(session_id), lines.c.line_id == line_id)).scalar_one_or_none()
            rows = conn.execute(
                sa.select(takes.c.take_id)
                .join(lines, sa.and_(lines.c.session_id == takes.c.session_id, lines.c.line_id == takes.c.line_id))
                .where(takes.c.session_id == session_id, takes.c.kept, lines.c.deleted_ms.is_(None),
                       lines.c.position < (2**31 - 1 if above is None else above))
                .order_by(lines.c.position, takes.c.take_id))
            return [int(take_id) for take_id in rows.scalars()]

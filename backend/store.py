"""SQLite persistence of directing sessions: sessions, lines, voices (codes) and takes (codes).

Design choices:
- One file (`retake.sqlite3` under `--data-dir`), one connection, used only from the event
  loop thread. Every write is one short transaction (milliseconds: codes of a take are tens
  of kilobytes), so the loop does it inline instead of hopping to a thread; this keeps the
  rule "written before announced" a matter of statement order in the caller.
- WAL journal with synchronous=NORMAL: a committed write survives the process dying (a
  restart loses nothing); only a power cut can lose the last transactions.
- Codes are stored as little-endian int32 bytes with their codebook count; the store knows
  numpy arrays, not torch tensors.
- Take ids come from one AUTOINCREMENT sequence over all sessions, so an id names one take
  on the whole server (the audio frame header carries it as u32).
- A running take's windows are written (their codes) as they stream, before they are sent;
  the take's codes replace them when it finishes. Takes that were queued or running when the
  server stopped are finished as `error` on open, with the codes of the windows they had sent,
  so the audio a director heard before a crash is kept.
- The schema evolves by numbered migrations (`PRAGMA user_version`): `SCHEMA` is the first
  version and stays as it was, a new file runs it and then every migration, so a file written
  by an older server and a new one end up with the same tables.
- The script: `lines.position` is a line's place (0, 1, ... over the lines not deleted),
  rewritten whenever the order changes (a script is at most a thousand short rows). A deleted
  line without takes is gone; one with takes stays, marked with `deleted_ms`, so its takes keep
  their line, and setting that line again brings it back with its takes.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

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

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_ms INTEGER NOT NULL,
    voice_id INTEGER
);
CREATE TABLE IF NOT EXISTS voices (
    voice_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    character TEXT,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS voice_references (
    voice_id INTEGER NOT NULL REFERENCES voices(voice_id),
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    codebooks INTEGER NOT NULL,
    codes BLOB NOT NULL,
    PRIMARY KEY (voice_id, idx)
);
CREATE TABLE IF NOT EXISTS lines (
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    line_id TEXT NOT NULL,
    text TEXT NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (session_id, line_id)
);
CREATE TABLE IF NOT EXISTS takes (
    take_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    line_id TEXT NOT NULL,
    text TEXT NOT NULL,
    voice_id INTEGER,
    sampling TEXT NOT NULL,
    history TEXT NOT NULL DEFAULT '[]',
    kept INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'queued',
    finish_reason TEXT,
    error TEXT,
    timings TEXT NOT NULL DEFAULT '{}',
    frames INTEGER NOT NULL DEFAULT 0,
    samples INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    codebooks INTEGER,
    codes BLOB,
    created_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS takes_by_session ON takes (session_id, take_id);
"""
# Migration n brings a file from user_version n - 1 to n; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    # 1: the script is stored: lines without takes, their order, deleted lines that have takes.
    "ALTER TABLE lines ADD COLUMN deleted_ms INTEGER;",
    # 2: the windows of a running take, written as they stream so a crash keeps what was heard.
    "CREATE TABLE take_windows (take_id INTEGER NOT NULL REFERENCES takes (take_id), seq INTEGER NOT NULL, "
    "codebooks INTEGER NOT NULL, codes BLOB NOT NULL, samples INTEGER NOT NULL, PRIMARY KEY (take_id, seq));",
)
STOPPED_DURING_TAKE = "the server stopped during this take"


class NewerSchema(RuntimeError):
    """The database file was written by a newer Retake; this one cannot use it."""


def check_schema(path: Path) -> None:
    """Raise NewerSchema if the file at `path` (if any) is from a newer Retake; changes nothing."""
    if not path.is_file():
        return
    with contextlib.closing(sqlite3.connect(path)) as db:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise NewerSchema(f"{path} was written by a newer Retake (schema {version}, this one knows "
                          f"{len(MIGRATIONS)}); upgrade Retake or use another --data-dir")


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
        }


TAKE_COLUMNS = ("take_id, session_id, line_id, text, voice_id, sampling, history, kept, state, finish_reason, "
                "error, timings, frames, samples, attempts, created_ms")


def _take(row: sqlite3.Row) -> StoredTake:
    return StoredTake(
        take_id=row["take_id"], session_id=row["session_id"], line_id=row["line_id"], text=row["text"],
        voice_id=row["voice_id"], sampling=cast(SamplingInfo, json.loads(row["sampling"])),
        history=json.loads(row["history"]), kept=bool(row["kept"]), state=row["state"],
        finish_reason=row["finish_reason"], error=row["error"], timings=json.loads(row["timings"]),
        frames=row["frames"], samples=row["samples"], attempts=row["attempts"], created_ms=row["created_ms"],
    )


class Store:
    """The session store; every method is one transaction, committed when it returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        check_schema(path)
        self.path = path
        # isolation_level=None: autocommit, with explicit transactions around multi-statement writes.
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        self._migrate()
        self.interrupted = self._finish_interrupted_takes()

    def close(self) -> None:
        self.db.close()

    def _write(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        return self.db.execute(sql, params)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """The writes inside as one transaction (committed at the end, rolled back on an exception)."""
        with self.db:
            self.db.execute("BEGIN")
            yield

    def _migrate(self) -> None:
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        for number in range(version + 1, len(MIGRATIONS) + 1):
            # executescript commits first; BEGIN ... COMMIT makes each migration all or nothing.
            self.db.executescript(f"BEGIN; {MIGRATIONS[number - 1]} PRAGMA user_version={number}; COMMIT;")

    def _finish_interrupted_takes(self) -> int:
        """Finish the takes a stopped server left queued or running, each with the windows it had sent."""
        interrupted = self.db.execute("SELECT take_id, attempts, timings FROM takes WHERE state != 'done'").fetchall()
        for take_id, attempts, timings in interrupted:
            windows = self.db.execute("SELECT codebooks, codes, samples FROM take_windows WHERE take_id=? "
                                      "ORDER BY seq", (take_id,)).fetchall()
            codes = np.concatenate([blob_to_codes(w["codebooks"], w["codes"]) for w in windows], axis=1) \
                if windows else None
            self.finish_take(take_id, "error", error=STOPPED_DURING_TAKE, timings=json.loads(timings or "{}"),
                             samples=sum(int(w["samples"]) for w in windows), attempts=attempts, codes=codes)
        return len(interrupted)

    # Sessions -----------------------------------------------------------------

    def create_session(self) -> str:
        session_id = secrets.token_hex(16)
        self._write("INSERT INTO sessions (session_id, created_ms) VALUES (?, ?)", (session_id, now_ms()))
        return session_id

    def has_session(self, session_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM sessions WHERE session_id=?", (session_id,)).fetchone() is not None

    # The script ---------------------------------------------------------------

    def lines(self, session_id: str) -> list[LineInfo]:
        """The script in order (deleted lines left out)."""
        rows = self.db.execute("SELECT line_id, text FROM lines WHERE session_id=? AND deleted_ms IS NULL "
                               "ORDER BY position, rowid", (session_id,)).fetchall()
        return [{"line_id": r["line_id"], "text": r["text"], "position": k} for k, r in enumerate(rows)]

    def line_ids(self, session_id: str) -> list[str]:
        return [line["line_id"] for line in self.lines(session_id)]

    def _place(self, session_id: str, order: list[str]) -> None:
        self.db.executemany("UPDATE lines SET position=? WHERE session_id=? AND line_id=?",
                            [(k, session_id, line_id) for k, line_id in enumerate(order)])

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
        with self._transaction():
            self.db.execute(
                "INSERT INTO lines (session_id, line_id, text, position) VALUES (?, ?, ?, -1) "
                "ON CONFLICT (session_id, line_id) DO UPDATE SET text=excluded.text, deleted_ms=NULL",
                (session_id, line_id, text))
            if moves:
                self._place(session_id, order)

    def delete_line(self, session_id: str, line_id: str) -> None:
        """Take the line out of the script: gone if it has no takes, else kept aside with them."""
        with self._transaction():
            has_takes = self.db.execute("SELECT 1 FROM takes WHERE session_id=? AND line_id=? LIMIT 1",
                                        (session_id, line_id)).fetchone() is not None
            if has_takes:
                self.db.execute("UPDATE lines SET deleted_ms=?, position=-1 WHERE session_id=? AND line_id=?",
                                (now_ms(), session_id, line_id))
            else:
                self.db.execute("DELETE FROM lines WHERE session_id=? AND line_id=?", (session_id, line_id))
            rest = [r[0] for r in self.db.execute(
                "SELECT line_id FROM lines WHERE session_id=? AND deleted_ms IS NULL ORDER BY position, rowid",
                (session_id,))]
            self._place(session_id, rest)

    def set_order(self, session_id: str, order: list[str]) -> None:
        """`order` lists every line of the script once (the caller checks)."""
        with self._transaction():
            self._place(session_id, order)

    def takes(self, session_id: str) -> list[StoredTake]:
        rows = self.db.execute(f"SELECT {TAKE_COLUMNS} FROM takes WHERE session_id=? ORDER BY take_id",
                               (session_id,)).fetchall()
        return [_take(r) for r in rows]

    def count_takes(self, session_id: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM takes WHERE session_id=?", (session_id,)).fetchone()[0])

    # Voices -------------------------------------------------------------------

    def set_voice(self, session_id: str, references: list[StoredReference],
                  character: CharacterSpec | None) -> StoredVoice | None:
        """Store a voice and make it the session's; neither references nor character = default voice."""
        if not references and character is None:
            self._write("UPDATE sessions SET voice_id=NULL WHERE session_id=?", (session_id,))
            return None
        spec = None if character is None else json.dumps(
            {"name": character.name, "description": character.description, "scene": character.scene})
        with self._transaction():
            voice_id = self.db.execute(
                "INSERT INTO voices (session_id, character, created_ms) VALUES (?, ?, ?)",
                (session_id, spec, now_ms())).lastrowid
            assert voice_id is not None
            for index, reference in enumerate(references):
                codebooks, blob = codes_to_blob(reference.codes)
                self.db.execute("INSERT INTO voice_references VALUES (?, ?, ?, ?, ?)",
                                (voice_id, index, reference.text, codebooks, blob))
            self.db.execute("UPDATE sessions SET voice_id=? WHERE session_id=?", (voice_id, session_id))
        return StoredVoice(voice_id, references, character)

    def session_voice(self, session_id: str) -> StoredVoice | None:
        row = self.db.execute("SELECT voice_id FROM sessions WHERE session_id=?", (session_id,)).fetchone()
        return None if row is None or row["voice_id"] is None else self.voice(row["voice_id"])

    def voice(self, voice_id: int) -> StoredVoice:
        row = self.db.execute("SELECT character FROM voices WHERE voice_id=?", (voice_id,)).fetchone()
        if row is None:
            raise KeyError(f"no voice {voice_id}")
        character = None if row["character"] is None else CharacterSpec(**json.loads(row["character"]))
        references = [
            StoredReference(r["text"], blob_to_codes(r["codebooks"], r["codes"]))
            for r in self.db.execute("SELECT text, codebooks, codes FROM voice_references WHERE voice_id=? "
                                     "ORDER BY idx", (voice_id,))
        ]
        return StoredVoice(voice_id, references, character)

    # Takes --------------------------------------------------------------------

    def add_take(self, session_id: str, line_id: str, text: str, voice_id: int | None,
                 sampling: SamplingInfo) -> StoredTake:
        """A queued take. Its line takes the take's text; a line not in the script (new, or
        deleted) goes last."""
        created = now_ms()
        with self._transaction():
            self.db.execute(
                "INSERT INTO lines (session_id, line_id, text, position) VALUES (?, ?, ?, "
                "(SELECT COUNT(*) FROM lines WHERE session_id=? AND deleted_ms IS NULL)) "
                "ON CONFLICT (session_id, line_id) DO UPDATE SET text=excluded.text, deleted_ms=NULL, "
                "position=CASE WHEN lines.deleted_ms IS NULL THEN lines.position ELSE excluded.position END",
                (session_id, line_id, text, session_id))
            take_id = self.db.execute(
                "INSERT INTO takes (session_id, line_id, text, voice_id, sampling, created_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, line_id, text, voice_id, json.dumps(sampling), created)).lastrowid
        assert take_id is not None
        take = self.take(session_id, take_id)
        assert take is not None
        return take

    def take(self, session_id: str, take_id: int) -> StoredTake | None:
        """The take if it belongs to this session (another session's take is as good as unknown)."""
        row = self.db.execute(f"SELECT {TAKE_COLUMNS} FROM takes WHERE take_id=? AND session_id=?",
                              (take_id, session_id)).fetchone()
        return None if row is None else _take(row)

    def start_take(self, take_id: int, attempt: int, sampling: SamplingInfo) -> None:
        with self._transaction():
            self._write("DELETE FROM take_windows WHERE take_id=?", (take_id,))  # an earlier attempt's
            self._write("UPDATE takes SET state='running', attempts=?, sampling=? WHERE take_id=?",
                        (attempt, json.dumps(sampling), take_id))

    def add_take_window(self, take_id: int, seq: int, codes: np.ndarray, samples: int) -> None:
        """A running take's window (its new frames' codes [codebooks, frames]), before it is sent."""
        codebooks, blob = codes_to_blob(codes)
        self._write("INSERT OR REPLACE INTO take_windows (take_id, seq, codebooks, codes, samples) "
                    "VALUES (?, ?, ?, ?, ?)", (take_id, seq, codebooks, blob, samples))

    def set_history(self, take_id: int, history: list[int]) -> None:
        self._write("UPDATE takes SET history=? WHERE take_id=?", (json.dumps(history), take_id))

    def finish_take(self, take_id: int, finish_reason: FinishReason, *, error: str | None,
                    timings: dict[str, float | int | None], samples: int, attempts: int,
                    codes: np.ndarray | None) -> None:
        codebooks, blob = (None, None) if codes is None else codes_to_blob(codes)
        frames = 0 if codes is None else int(codes.shape[1])
        with self._transaction():
            self._write(
                "UPDATE takes SET state='done', finish_reason=?, error=?, timings=?, frames=?, samples=?, attempts=?, "
                "codebooks=?, codes=? WHERE take_id=?",
                (finish_reason, error, json.dumps(timings), frames, samples, attempts, codebooks, blob, take_id))
            self._write("DELETE FROM take_windows WHERE take_id=?", (take_id,))

    def take_codes(self, take_id: int) -> np.ndarray | None:
        row = self.db.execute("SELECT codebooks, codes FROM takes WHERE take_id=?", (take_id,)).fetchone()
        if row is None or row["codes"] is None:
            return None
        return blob_to_codes(row["codebooks"], row["codes"])

    def set_kept(self, take_id: int, kept: bool) -> None:
        self._write("UPDATE takes SET kept=? WHERE take_id=?", (int(kept), take_id))

    def kept_history(self, session_id: str, line_id: str | None = None) -> list[int]:
        """The kept takes of the script in script order (by line, then take id): all of them, or,
        given a line of the script, those of the lines above it (what a take of that line hears).
        Takes of deleted lines are never in it."""
        above = None if line_id is None else self.db.execute(
            "SELECT position FROM lines WHERE session_id=? AND line_id=? AND deleted_ms IS NULL",
            (session_id, line_id)).fetchone()
        rows = self.db.execute(
            "SELECT t.take_id FROM takes t JOIN lines l ON l.session_id = t.session_id AND l.line_id = t.line_id "
            "WHERE t.session_id=? AND t.kept=1 AND l.deleted_ms IS NULL AND l.position < ? "
            "ORDER BY l.position, t.take_id", (session_id, 2**62 if above is None else above[0])).fetchall()
        return [int(r["take_id"]) for r in rows]

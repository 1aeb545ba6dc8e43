"""Persistence of directing sessions: sessions, script, voices (codes), takes (codes and audio),
cast and scenes, in SQLite (the embedded default) or PostgreSQL (replicas sharing one database),
through backend/schema.py. One module per concept, each a part of `Store`:
sessions (and their keys), script (lines), voices, saved_voices, takes, cast, scenes; rows holds
what they share.

Design choices:
- One SQLite file (`retake.sqlite3` under `--data-dir`) or one PostgreSQL database
  (`--database postgresql://...`), used by the server from one store thread
  (backend/store_thread.py), never from the event loop: a frozen or full disk then holds up
  only the calls waiting for it. Every write is one short transaction; the store thread runs
  them in the order they were asked for, which keeps "written before announced" a matter of
  order in the caller.
- A committed write survives the process dying (SQLite: WAL with synchronous=NORMAL; only a
  power cut can lose the last transactions. PostgreSQL: its own durability).
- `Store` is the parts as mixins over one engine (rather than one object per part): every
  caller keeps one handle, and a part's method may call another's (`session_voice` -> `voice`).
- Opening the store finishes the takes that dead replicas left unfinished
  (backend/store/takes.py), so what a director heard before a crash is kept.
"""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa

from backend import replicas, schema
from backend.schema import NewerSchema, Unreachable
from backend.store.cast import KEEP_VOICE, Cast, CastMember
from backend.store.saved_voices import SavedVoice, SavedVoices
from backend.store.scenes import Scenes, SceneSummary
from backend.store.script import Script
from backend.store.sessions import SessionKey, Sessions
from backend.store.takes import STOPPED_DURING_TAKE, StoredTake, Takes, audio_url
from backend.store.voices import StoredReference, StoredVoice, Voices

__all__ = ["KEEP_VOICE", "STOPPED_DURING_TAKE", "CastMember", "NewerSchema", "SavedVoice", "SceneSummary",
           "SessionKey", "Store", "StoredReference", "StoredTake", "StoredVoice", "Unreachable", "audio_url",
           "check_schema", "describe"]


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


class Store(Sessions, Script, Voices, SavedVoices, Takes, Cast, Scenes):
    """The session store; every method is one transaction, committed when it returns.

    `database`: a SQLite file (Path) or a database URL (str, `postgresql://user@host/db`)."""

    def __init__(self, database: Path | str) -> None:
        self.name = describe(database)
        self.local = threading.local()
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

"""The store's tables, one schema for SQLite and PostgreSQL, and its migrations.

Design choices:
- SQLAlchemy Core (no ORM): the tables below are what the queries in backend/store/ are
  written against; SQLAlchemy renders them for either database (BLOB or BYTEA, AUTOINCREMENT
  or SERIAL, upserts, partial indexes), and psycopg 3 is the PostgreSQL driver.
- A database is opened from a path (a SQLite file, the embedded default) or a URL
  (`postgresql://user@host/db`, `sqlite:///file`). SQLite keeps the durability it always had:
  WAL journal, synchronous=NORMAL (a committed write survives the process dying), and every
  transaction starts with BEGIN IMMEDIATE, so several processes on one host can share a file
  (a writer waits for the lock instead of failing when another one wrote first).
- One ordered list of migrations, numbered as the SQLite store always numbered its schema
  (`PRAGMA user_version`, kept on SQLite so an older Retake refuses a newer file; a table
  `retake_schema` on PostgreSQL). Version 2 is the baseline: a new database is created at it
  from `BASELINE` (frozen, as it shipped), a SQLite file from before it runs the SQL migrations
  it was written for, and every database then runs the migrations after it, so a new and an
  old database end with the same tables (a test compares them with `metadata`). Each
  migration runs in one transaction (both databases have transactional DDL) under a lock, so
  replicas starting together migrate once. Never edit a migration that has shipped.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine

metadata = sa.MetaData()

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("voice_id", sa.Integer),
    sa.Column("name", sa.Text),  # the scene's name (NULL: unnamed)
    sa.Column("updated_ms", sa.BigInteger),  # the last change to its script, cast or takes (NULL: created_ms)
    sa.Column("deleted_ms", sa.BigInteger),  # deleted (restorable) since then; NULL: live
    sa.Column("key_hash", sa.Text),  # SHA-256 (hex) of the session's key; NULL: a session from before keys
)
voices = sa.Table(
    "voices", metadata,
    sa.Column("voice_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), nullable=False),
    sa.Column("character", sa.Text),  # JSON {name, description, scene}; NULL for reference clips
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sqlite_autoincrement=True,
)
voice_references = sa.Table(
    "voice_references", metadata,
    sa.Column("voice_id", sa.Integer, sa.ForeignKey("voices.voice_id"), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("codebooks", sa.Integer, nullable=False),
    sa.Column("codes", sa.LargeBinary, nullable=False),
)
lines = sa.Table(
    "lines", metadata,
    sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), primary_key=True),
    sa.Column("line_id", sa.Text, primary_key=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("deleted_ms", sa.BigInteger),
    sa.Column("character_id", sa.Text),  # the cast member who says the line (NULL: the scene's first)
)
takes = sa.Table(
    "takes", metadata,
    sa.Column("take_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), nullable=False),
    sa.Column("line_id", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("voice_id", sa.Integer),
    sa.Column("sampling", sa.Text, nullable=False),  # JSON
    sa.Column("history", sa.Text, nullable=False, server_default="[]"),  # JSON list of take ids
    sa.Column("kept", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("state", sa.Text, nullable=False, server_default="queued"),
    sa.Column("finish_reason", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("timings", sa.Text, nullable=False, server_default="{}"),  # JSON
    sa.Column("frames", sa.Integer, nullable=False, server_default="0"),
    sa.Column("samples", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("codebooks", sa.Integer),
    sa.Column("codes", sa.LargeBinary),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("replica", sa.Integer),  # the server process that queued or runs it (backend/replicas.py)
    sa.Column("character_id", sa.Text),  # the cast member it was a take of (NULL: none, the session's voice)
    sa.Column("note", sa.Text),  # the director's note (NULL: none)
    sa.Column("rating", sa.Integer),  # 1..5 (NULL: not rated)
    sa.Column("guard_frames", sa.Integer),  # the length guard's cap on its frames (NULL: no guard)
    sa.Column("dropped", sa.Text),  # JSON list of the history's take ids left out to fit the prompt (NULL: none)
    sqlite_autoincrement=True,
)
sa.Index("takes_by_session", takes.c.session_id, takes.c.take_id)
sa.Index("takes_unfinished", takes.c.replica, sqlite_where=takes.c.state != "done",
         postgresql_where=takes.c.state != "done")
take_windows = sa.Table(
    "take_windows", metadata,
    sa.Column("take_id", sa.Integer, sa.ForeignKey("takes.take_id"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("codebooks", sa.Integer, nullable=False),
    sa.Column("codes", sa.LargeBinary, nullable=False),
    sa.Column("samples", sa.Integer, nullable=False),
)
cast_members = sa.Table(
    "cast_members", metadata,
    sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), primary_key=True),
    sa.Column("character_id", sa.Text, primary_key=True),  # chosen by the client, like line ids
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("voice_id", sa.Integer),  # its voice (voices.voice_id); NULL: the engine's default voice
    sa.Column("position", sa.Integer, nullable=False),  # the cast's order (0 is the scene's first character)
)
take_audio = sa.Table(
    "take_audio", metadata,
    sa.Column("take_id", sa.Integer, sa.ForeignKey("takes.take_id"), primary_key=True),
    sa.Column("sample_rate", sa.Integer, nullable=False),
    sa.Column("pcm", sa.LargeBinary, nullable=False),  # PCM16 little-endian mono: the samples that streamed
)


saved_voices = sa.Table(
    "saved_voices", metadata,
    sa.Column("voice_id", sa.Text, primary_key=True),  # voice_ and 16 hex digits
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("character", sa.Text),  # JSON {name, description, scene}; NULL for clips
    sa.Column("consent", sa.Text),  # OpenAI's consent recording id, as given
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)
sa.Index("saved_voices_by_name", saved_voices.c.name, unique=True)
saved_voice_clips = sa.Table(
    "saved_voice_clips", metadata,
    sa.Column("voice_id", sa.Text, sa.ForeignKey("saved_voices.voice_id"), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("text", sa.Text, nullable=False),  # the transcript
    sa.Column("audio", sa.LargeBinary, nullable=False),  # the WAV or FLAC file as uploaded
)


class NewerSchema(RuntimeError):
    """The database was written by a newer Retake; this one cannot use it."""


class Unreachable(RuntimeError):
    """The database cannot be opened (a server that does not answer, a file that cannot be read)."""


# The store as it was before PostgreSQL (a SQLite file only) had schema 0 and these two SQL
# migrations; a file from then runs those it lacks, every new database starts at BASELINE_VERSION.
SQLITE_MIGRATIONS = (
    # 1: the script is stored: lines without takes, their order, deleted lines that have takes.
    "ALTER TABLE lines ADD COLUMN deleted_ms INTEGER;",
    # 2: the windows of a running take, written as they stream so a crash keeps what was heard.
    "CREATE TABLE take_windows (take_id INTEGER NOT NULL REFERENCES takes (take_id), seq INTEGER NOT NULL, "
    "codebooks INTEGER NOT NULL, codes BLOB NOT NULL, samples INTEGER NOT NULL, PRIMARY KEY (take_id, seq));",
)
BASELINE_VERSION = len(SQLITE_MIGRATIONS)


def baseline(conn: Connection) -> None:
    """Schema 2 on a new database of either kind, frozen as it shipped."""
    frozen = sa.MetaData()
    sa.Table("sessions", frozen, sa.Column("session_id", sa.Text, primary_key=True),
             sa.Column("created_ms", sa.BigInteger, nullable=False), sa.Column("voice_id", sa.Integer))
    sa.Table("voices", frozen, sa.Column("voice_id", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), nullable=False),
             sa.Column("character", sa.Text), sa.Column("created_ms", sa.BigInteger, nullable=False),
             sqlite_autoincrement=True)
    sa.Table("voice_references", frozen,
             sa.Column("voice_id", sa.Integer, sa.ForeignKey("voices.voice_id"), primary_key=True),
             sa.Column("idx", sa.Integer, primary_key=True), sa.Column("text", sa.Text, nullable=False),
             sa.Column("codebooks", sa.Integer, nullable=False), sa.Column("codes", sa.LargeBinary, nullable=False))
    sa.Table("lines", frozen, sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), primary_key=True),
             sa.Column("line_id", sa.Text, primary_key=True), sa.Column("text", sa.Text, nullable=False),
             sa.Column("position", sa.Integer, nullable=False), sa.Column("deleted_ms", sa.BigInteger))
    frozen_takes = sa.Table(
        "takes", frozen, sa.Column("take_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), nullable=False),
        sa.Column("line_id", sa.Text, nullable=False), sa.Column("text", sa.Text, nullable=False),
        sa.Column("voice_id", sa.Integer), sa.Column("sampling", sa.Text, nullable=False),
        sa.Column("history", sa.Text, nullable=False, server_default="[]"),
        sa.Column("kept", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("state", sa.Text, nullable=False, server_default="queued"),
        sa.Column("finish_reason", sa.Text), sa.Column("error", sa.Text),
        sa.Column("timings", sa.Text, nullable=False, server_default="{}"),
        *(sa.Column(name, sa.Integer, nullable=False, server_default="0")
          for name in ("frames", "samples", "attempts")),
        sa.Column("codebooks", sa.Integer), sa.Column("codes", sa.LargeBinary),
        sa.Column("created_ms", sa.BigInteger, nullable=False), sqlite_autoincrement=True)
    sa.Index("takes_by_session", frozen_takes.c.session_id, frozen_takes.c.take_id)
    sa.Table("take_windows", frozen, sa.Column("take_id", sa.Integer, sa.ForeignKey("takes.take_id"), primary_key=True),
             sa.Column("seq", sa.Integer, primary_key=True), sa.Column("codebooks", sa.Integer, nullable=False),
             sa.Column("codes", sa.LargeBinary, nullable=False), sa.Column("samples", sa.Integer, nullable=False))
    frozen.create_all(conn)


def add_column(conn: Connection, table: str, column: sa.Column[Any]) -> None:
    """ALTER TABLE ... ADD COLUMN, with the column's type as this database names it."""
    kind = column.type.compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}"))


def replica_column(conn: Connection) -> None:
    """3: which server process queued or runs a take, so replicas sharing a database finish only
    the takes of a replica that died (and find them fast)."""
    add_column(conn, "takes", sa.Column("replica", sa.Integer))
    conn.execute(sa.text("CREATE INDEX takes_unfinished ON takes (replica) WHERE state != 'done'"))


def saved_voice_tables(conn: Connection) -> None:
    """4: voices saved by name (backend/directing/voices.py): clips as uploaded with their
    transcripts, or a described character."""
    frozen = sa.MetaData()
    voices_table = sa.Table(
        "saved_voices", frozen, sa.Column("voice_id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False), sa.Column("character", sa.Text), sa.Column("consent", sa.Text),
        sa.Column("created_ms", sa.BigInteger, nullable=False))
    sa.Index("saved_voices_by_name", voices_table.c.name, unique=True)
    sa.Table("saved_voice_clips", frozen,
             sa.Column("voice_id", sa.Text, sa.ForeignKey("saved_voices.voice_id"), primary_key=True),
             sa.Column("idx", sa.Integer, primary_key=True), sa.Column("text", sa.Text, nullable=False),
             sa.Column("audio", sa.LargeBinary, nullable=False))
    frozen.create_all(conn)


def scene_studio(conn: Connection) -> None:
    """5: the studio for a whole scene (docs/protocol.md): scenes have a name, a last change and
    a restorable deletion; a cast of characters, each line said by one; a take keeps its
    character, note, rating, the length guard's cap, and its audio (the PCM that streamed, so
    playing, reloading and exporting it never call the engine again)."""
    added = [("sessions", "name", sa.Text), ("sessions", "updated_ms", sa.BigInteger),
             ("sessions", "deleted_ms", sa.BigInteger), ("lines", "character_id", sa.Text),
             ("takes", "character_id", sa.Text), ("takes", "note", sa.Text), ("takes", "rating", sa.Integer),
             ("takes", "guard_frames", sa.Integer)]
    for table, name, kind in added:
        add_column(conn, table, sa.Column(name, kind))
    frozen = sa.MetaData()
    # The tables the new ones refer to (they exist; only their keys are named here).
    sa.Table("sessions", frozen, sa.Column("session_id", sa.Text, primary_key=True))
    sa.Table("takes", frozen, sa.Column("take_id", sa.Integer, primary_key=True))
    sa.Table("cast_members", frozen,
             sa.Column("session_id", sa.Text, sa.ForeignKey("sessions.session_id"), primary_key=True),
             sa.Column("character_id", sa.Text, primary_key=True), sa.Column("name", sa.Text, nullable=False),
             sa.Column("voice_id", sa.Integer), sa.Column("position", sa.Integer, nullable=False)).create(conn)
    sa.Table("take_audio", frozen, sa.Column("take_id", sa.Integer, sa.ForeignKey("takes.take_id"), primary_key=True),
             sa.Column("sample_rate", sa.Integer, nullable=False),
             sa.Column("pcm", sa.LargeBinary, nullable=False)).create(conn)


def session_keys(conn: Connection) -> None:
    """6: a session is opened with its key, not its id alone (the id is in export URLs and logs);
    the store keeps the key's hash. Sessions stored before have none until they are resumed."""
    add_column(conn, "sessions", sa.Column("key_hash", sa.Text))


def dropped_history(conn: Connection) -> None:
    """7: a take remembers the kept takes left out of its prompt to fit the row limit, so a
    resumed studio still shows what it did not hear. Takes stored before have none."""
    add_column(conn, "takes", sa.Column("dropped", sa.Text))


# Migration n brings a database from version n - 1 to n, on either kind of database.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    3: replica_column, 4: saved_voice_tables, 5: scene_studio, 6: session_keys, 7: dropped_history}
VERSION = BASELINE_VERSION + len(MIGRATIONS)
MIGRATION_LOCK = 0x5245_5441  # "RETA": the advisory lock that serializes migrations on PostgreSQL


def database_url(database: Path | str) -> URL:
    """A path is a SQLite file; a string is a URL (postgresql:// means psycopg 3)."""
    if isinstance(database, Path):
        return URL.create("sqlite", database=str(database))
    try:
        url = sa.make_url(database)
    except sa.exc.ArgumentError:
        raise Unreachable(f"{database!r} is not a database URL (postgresql://user@host/db)") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername not in ("postgresql+psycopg", "sqlite"):
        raise Unreachable(f"{url.drivername} databases are not supported; use postgresql://user@host/db")
    return url


def connect(database: Path | str) -> Engine:
    """An engine for the database; nothing is opened until the first use."""
    url = database_url(database)
    if url.get_backend_name() == "postgresql":
        # pre_ping: a connection the server dropped (a restart) is replaced, not handed out.
        return sa.create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})
    if url.database:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def configure(dbapi: Any, _record: Any) -> None:
        dbapi.isolation_level = None  # the driver's own transactions off: BEGIN comes from `begin` below
        dbapi.execute("PRAGMA busy_timeout=30000")
        wal(dbapi)
        for pragma in ("synchronous=NORMAL", "foreign_keys=ON"):
            dbapi.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def wal(dbapi: Any) -> None:
    """Switch a SQLite file to WAL. The switch needs the file to itself and SQLite answers
    "database is locked" at once, without its busy handler, while another process opens the
    file in the same instant (replicas starting together): retry it for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            dbapi.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def version(conn: Connection) -> int:
    if conn.dialect.name == "sqlite":
        return int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
    if not sa.inspect(conn).has_table("retake_schema"):
        return 0
    return int(conn.execute(sa.text("SELECT version FROM retake_schema")).scalar_one())


def set_version(conn: Connection, number: int) -> None:
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"PRAGMA user_version={number}")
        return
    conn.execute(sa.text("CREATE TABLE IF NOT EXISTS retake_schema (version INTEGER NOT NULL)"))
    conn.execute(sa.text("DELETE FROM retake_schema"))
    conn.execute(sa.text("INSERT INTO retake_schema (version) VALUES (:n)"), {"n": number})


def check(conn: Connection, where: str) -> int:
    """The database's version; NewerSchema if a newer Retake wrote it (`where` names it)."""
    number = version(conn)
    if number > VERSION:
        other = "--data-dir" if conn.dialect.name == "sqlite" else "--database"
        raise NewerSchema(f"{where} was written by a newer Retake (schema {number}, this one knows {VERSION}); "
                          f"upgrade Retake or use another {other}")
    return number


def migrate(engine: Engine, where: str) -> None:
    """Bring the database to VERSION, one transaction per step (or refuse a newer one)."""
    while True:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # replicas starting together take turns
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK)))
            number = check(conn, where)
            if number == VERSION:
                return
            if number == 0 and not sa.inspect(conn).has_table("sessions"):
                baseline(conn)
                set_version(conn, BASELINE_VERSION)
            elif number < BASELINE_VERSION:  # a SQLite file from before PostgreSQL
                conn.exec_driver_sql(SQLITE_MIGRATIONS[number])
                set_version(conn, number + 1)
            else:
                MIGRATIONS[number + 1](conn)
                set_version(conn, number + 1)

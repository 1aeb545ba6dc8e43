"""What the store's parts share: the transaction every method opens, codes as bytes, the clock,
and the statements that more than one part writes.

Design choices:
- Each concept of the store (sessions, script, voices, saved voices, takes, cast, scenes) is a
  mixin over `Part`, and `Store` (backend/store/__init__.py) is all of them over one engine:
  callers see one object, each module holds one concept's queries.
- Every method is one transaction (`_transaction`), committed when it returns; `together`
  makes the calls of a block one transaction (a request's reads and its write).
- Codes are stored as little-endian int32 bytes with their codebook count; the store knows
  numpy arrays, not torch tensors.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from backend.replicas import Replica
from backend.schema import lines


class Part:
    """A part of Store: the engine and replica that Store opens, and its transactions."""

    engine: Engine
    replica: Replica
    local: threading.local  # per thread: the connection of a `together` block, if one is open

    def _transaction(self) -> Any:
        """The statements inside as one transaction (committed at the end, rolled back on an
        exception); inside `together`, that block's transaction."""
        conn = getattr(self.local, "conn", None)
        return contextlib.nullcontext(conn) if conn is not None else self.engine.begin()

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Every store call inside (on this thread) as one transaction, committed at the end:
        a request's checks and its write see one state of the database and land together (a
        take's start: 14 transactions before; on 2 CPU cores the time to take.queued did not
        move, ~9 ms p50 either way)."""
        if getattr(self.local, "conn", None) is not None:
            yield
            return
        with self.engine.begin() as conn:
            self.local.conn = conn
            try:
                yield
            finally:
                self.local.conn = None


def now_ms() -> int:
    return int(time.time() * 1000)


def codes_to_blob(codes: np.ndarray) -> tuple[int, bytes]:
    if codes.ndim != 2:
        raise ValueError(f"codes must be [codebooks, frames]; got shape {codes.shape}")
    return codes.shape[0], np.ascontiguousarray(codes, dtype="<i4").tobytes()


def blob_to_codes(codebooks: int, blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i4").astype(np.int64).reshape(codebooks, -1)  # [codebooks, frames]


def upsert(conn: Connection, table: sa.Table) -> Any:
    """INSERT ... ON CONFLICT for this database (both dialects spell it the same way)."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


def live(session_id: str) -> sa.ColumnElement[bool]:
    """The session's lines that are in the script (not deleted)."""
    return sa.and_(lines.c.session_id == session_id, lines.c.deleted_ms.is_(None))


SCRIPT = (lines.c.position, lines.c.line_id)  # the script's order (positions are unique; the id is a tiebreak)

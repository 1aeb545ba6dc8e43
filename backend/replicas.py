"""Replicas: the server processes that share one store, and whether one of them is still alive.

Design choices:
- A replica is one open Store (one `retake serve` process): a random 31-bit id, written on each
  take it queues. The takes of a replica that died are finished by the others as interrupted,
  with the windows their directors heard; a live replica's takes are left alone.
- Alive means holding a lock that the operating system or the database server lets go the
  moment the process dies, SIGKILL included (PostgreSQL: when its backend reads the closed
  socket, a moment later), so there is no heartbeat to wait for or to tune:
  on PostgreSQL a session advisory lock on the replica's own connection (released when that
  connection closes), on SQLite an exclusive flock on a file in a folder beside the database
  (released when the process's descriptors close). Another replica that can take the lock
  knows the holder is gone.
- A whole host that vanishes without closing its sockets is noticed by the PostgreSQL server's
  TCP keepalives (deploy/ sets them to seconds); until then its takes stay running.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

REPLICA_LOCKS = 0x5245_5450  # "RETP": the first key of the replicas' advisory locks (the second is the id)


def new_id() -> int:
    return secrets.randbelow(2**31 - 2) + 1


class Replica:
    """This process's claim to be alive, and the test of another's."""

    id: int

    def alive(self, conn: Connection, replica_id: int | None) -> bool:
        raise NotImplementedError

    def forget(self, replica_id: int) -> None:
        """A dead replica whose takes are all finished leaves no trace."""

    def close(self) -> None:
        raise NotImplementedError


class PostgresReplica(Replica):
    def __init__(self, engine: Engine) -> None:
        self.id = new_id()
        self.holder = engine.connect()  # held for the replica's life: its lock goes with it
        self.holder.execute(sa.select(sa.func.pg_advisory_lock(REPLICA_LOCKS, self.id)))
        self.holder.commit()

    def alive(self, conn: Connection, replica_id: int | None) -> bool:
        if replica_id is None or replica_id == self.id:
            return replica_id is not None
        # A transaction lock: held (so a second sweeper waits its turn) until `conn` commits.
        taken = conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(REPLICA_LOCKS, replica_id))).scalar_one()
        return not taken

    def close(self) -> None:
        self.holder.close()


class FileReplica(Replica):
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.id = new_id()
        self.path = folder / f"{self.id}.lock"
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def alive(self, conn: Connection, replica_id: int | None) -> bool:
        if replica_id is None or replica_id == self.id:
            return replica_id is not None
        try:
            fd = os.open(self.folder / f"{replica_id}.lock", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # lets go of the probe's lock too
        return False

    def forget(self, replica_id: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{replica_id}.lock").unlink()

    def close(self) -> None:
        self.forget(self.id)
        os.close(self.fd)


def claim(engine: Engine) -> Replica:
    if engine.dialect.name == "postgresql":
        return PostgresReplica(engine)
    database = engine.url.database
    assert database, "a SQLite store is a file"
    return FileReplica(Path(f"{database}-replicas"))

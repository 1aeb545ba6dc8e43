"""Replicas sharing one store (backend/replicas.py), on SQLite and on PostgreSQL: a live replica's
takes are left alone; the takes of one killed with SIGKILL are finished by another, with the
windows its director heard; a session resumed on another replica hears how its take ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from live_server import run

from backend.directing.jobs import SilenceGuard
from backend.directing.protocol import SamplingInfo
from backend.store import STOPPED_DURING_TAKE, Store
from backend.tools.client import Director

SAMPLING: SamplingInfo = {"temperature": 1.0, "top_p": 0.9, "top_k": 30, "max_new_tokens": 20, "seed": 5}
# A replica in its own process: a session with a running take that has sent one window, then it
# waits for a line on stdin and kills itself (no close, no cleanup: as a crash).
REPLICA = """
import os, signal, sys
from pathlib import Path
import numpy as np
from backend.store import Store
database = sys.argv[1] if "://" in sys.argv[1] else Path(sys.argv[1])
store = Store(database)
session = store.create_session()
take = store.add_take(session, "a", "Interrupted.", None, {"seed": 5})
store.start_take(take.take_id, 1, {"seed": 5})
store.add_take_window(take.take_id, 0, np.arange(40).reshape(10, 4), 4 * 2048)
print(session, take.take_id, store.replica.id, flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


def gone(store: Store, replica_id: int) -> None:
    """Waits until the store sees the replica dead. On PostgreSQL its lock goes when the database
    server's backend reads the closed socket, a moment after the process dies (CI's loaded machine
    once swept before that moment); on SQLite the flock goes with the process."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with store.engine.begin() as conn:
            if not store.replica.alive(conn, replica_id):
                return
        time.sleep(0.05)
    raise AssertionError(f"replica {replica_id} still holds its lock 60 s after it was killed")


def test_the_takes_of_a_killed_replica_are_finished_as_heard(database: Path | str) -> None:
    survivor = Store(database)
    replica = subprocess.Popen([sys.executable, "-c", REPLICA, str(database)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert replica.stdout is not None and replica.stdin is not None
        session, take_id, replica_id = replica.stdout.readline().split()
        # Alive: neither a replica already running nor one starting now touches its take.
        assert survivor.finish_orphaned_takes(session) == 0 and survivor.finish_orphaned_takes() == 0
        starting = Store(database)
        assert starting.interrupted == 0 and starting.replica.id not in (survivor.replica.id, int(replica_id))
        starting.close()
        running = survivor.take(session, int(take_id))
        assert running is not None and running.state == "running"
        # My own takes are never orphans.
        mine = survivor.add_take(survivor.create_session(), "b", "Mine.", None, SAMPLING)
        replica.stdin.write("die\n")
        replica.stdin.flush()
        assert replica.wait(timeout=60) == -9
    finally:
        replica.kill()
        replica.wait()
    gone(survivor, int(replica_id))
    assert survivor.finish_orphaned_takes(session) == 1
    take = survivor.take(session, int(take_id))
    assert take is not None and (take.state, take.finish_reason, take.error) == ("done", "error", STOPPED_DURING_TAKE)
    assert (take.frames, take.samples, take.attempts) == (4, 4 * 2048, 1)
    np.testing.assert_array_equal(survivor.take_codes(take.take_id), np.arange(40).reshape(10, 4))
    assert survivor.finish_orphaned_takes() == 0  # nothing left to finish, and mine is still queued
    queued = survivor.take(mine.session_id, mine.take_id)
    assert queued is not None and queued.state == "queued"
    survivor.close()


def test_a_session_resumed_on_another_replica_hears_how_its_take_ended(make_server, database: Path | str) -> None:
    """Two live servers on one store (SQLite file or PostgreSQL): the session moves to B while A
    still runs its take; B says take.done when A finishes it."""
    where: dict[str, object] = {"database_url": database} if isinstance(database, str) else {
        "data_dir": database.parent}
    first, second = make_server(**where, silence=SilenceGuard(retries=0)), make_server(**where)

    async def main() -> None:
        on_a = await Director.connect(first.ws)
        session = (await on_a.open())["session_id"]
        take = await on_a.start("l1", "A long speech that goes on.", sampling={"seed": 11, "max_new_tokens": 100})
        await on_a.expect("take.started")
        on_b = await Director.connect(second.ws)
        ready = await on_b.open(str(session))
        [stored] = ready["takes"]  # type: ignore[misc]
        assert stored["take_id"] == take.take_id and stored["state"] in ("queued", "running")
        finished = await on_a.finish(take)  # A never heard of B: its director hears the take to the end
        done = await on_b.expect("take.done")
        assert done["take_id"] == take.take_id and done["finish_reason"] == finished.done["finish_reason"] == "length"
        assert done["frames"] == finished.done["frames"] == 100
        await on_a.close()
        await on_b.close()

    run(main())

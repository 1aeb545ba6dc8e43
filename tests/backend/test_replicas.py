"""Replicas sharing one store (backend/replicas.py), on SQLite and on PostgreSQL: a live replica's
takes are left alone; the takes of one killed with SIGKILL are finished by another, with the
windows its director heard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from backend.directing.protocol import SamplingInfo
from backend.store import STOPPED_DURING_TAKE, Store

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
    assert survivor.finish_orphaned_takes(session) == 1
    take = survivor.take(session, int(take_id))
    assert take is not None and (take.state, take.finish_reason, take.error) == ("done", "error", STOPPED_DURING_TAKE)
    assert (take.frames, take.samples, take.attempts) == (4, 4 * 2048, 1)
    np.testing.assert_array_equal(survivor.take_codes(take.take_id), np.arange(40).reshape(10, 4))
    assert survivor.finish_orphaned_takes() == 0  # nothing left to finish, and mine is still queued
    queued = survivor.take(mine.session_id, mine.take_id)
    assert queued is not None and queued.state == "queued"
    survivor.close()

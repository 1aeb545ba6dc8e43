"""Draining: a replica leaves the balancer without cutting a take short (the first SIGTERM).

Design choices:
- While draining, `/health` answers 503 `{"status": "draining"}`, so the balancer sends no
  one new (HAProxy's check, deploy/haproxy.cfg); a new directing socket is closed at once and
  a take.start is refused (`error` code `draining`); every socket whose take is done, or that
  has none, is closed with 1012 ("service restart"), which clients answer by reconnecting,
  through the balancer to another replica, and resuming the session there. Running takes
  finish and their director hears them to the end.
- Then (no take left, or `--drain-seconds` passed) the server stops as on SIGINT: uvicorn
  closes what is left with 1012, and a take cut short there is finished as interrupted, with
  what its director heard, by the replica that resumes its session.
- Polled every 100 ms: a few set lookups, and no hook in the take's path.
- Live conversations (/converse) cannot move to another replica; they end at the stop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from backend.state import ServerState

log = logging.getLogger("retake")
RECONNECT = 1012  # "service restart": reconnect (through the balancer, to another replica) and resume
REASON = "this replica is draining: reconnect"


async def drain(state: ServerState, seconds: float) -> None:
    """Stop taking work and let the running takes finish (at most `seconds`); returns when done."""
    state.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    log.info("draining: no new takes; %d sockets, closed as their takes end (at most %gs)", state.sockets, seconds)
    while True:
        busy = 0
        for socket in list(state.directing):
            if socket.idle():
                socket.outbox.close(RECONNECT, REASON)
            else:
                busy += 1
        if busy == 0 or loop.time() >= deadline:
            log.info("drained%s; stopping", "" if busy == 0 else f" but for {busy} takes (time is up)")
            return
        await asyncio.sleep(0.1)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining on the first SIGTERM; a second SIGTERM or SIGINT stops at once."""

    def __init__(self, config: uvicorn.Config, app: Starlette, seconds: float) -> None:
        super().__init__(config)
        self.app = app
        self.seconds = seconds
        self.draining: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state: ServerState | None = getattr(self.app.state, "retake", None)  # set once the lifespan started
        if sig != signal.SIGTERM or self.draining is not None or state is None or self.loop is None:
            super().handle_exit(sig, frame)
            return
        loop = self.loop

        def start() -> None:
            self.draining = loop.create_task(drain(state, self.seconds))
            self.draining.add_done_callback(lambda _task: setattr(self, "should_exit", True))

        loop.call_soon_threadsafe(start)  # we are in a signal handler: hand over to the loop

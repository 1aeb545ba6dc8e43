"""What the whole server shares: settings, the store, the engine loops, metrics, open sessions.

Design choices:
- It lives on `app.state.retake` and is only touched from the event loop thread (the engine
  threads reach the event loop through `call_soon_threadsafe`, never through this object).
  The store is the exception: it is called on the store thread only (`db`,
  backend/store_thread.py), so a slow or full disk never holds up the event loop.
- The open directing sessions are held as `SessionSocket`s, the little of a directing socket
  (backend/directing/session.py) that another socket or a take needs: its outbox, letting go
  of its session, and hearing that its take ended. So this module imports no handlers, and
  nothing imports in a circle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from backend.conversation.loop import ConversationLoop
from backend.directing.jobs import CallJob
from backend.directing.loop import EngineLoop
from backend.directing.protocol import ServerMessage
from backend.metrics import Metrics
from backend.settings import Settings
from backend.store import Store
from backend.store_thread import StoreThread
from backend.transport import Outbox
from engine import Drama3Engine

T = TypeVar("T")


class SessionSocket(Protocol):
    """The directing socket that holds a session, as others see it."""

    outbox: Outbox[ServerMessage]

    def detach(self) -> None:
        """Stop the socket's take and let go of its session (another socket resumed it)."""

    def take_ended(self, take_id: int) -> None:
        """The take ended (its take.done is in an outbox): it is no longer the socket's active take."""

    def idle(self) -> bool:
        """No take of this socket is queued or running (draining closes it then)."""


@dataclass(frozen=True)
class EngineInfo:
    name: str
    sample_rate: int
    frame_samples: int
    demo_weights: bool


@dataclass
class ServerState:
    settings: Settings
    store: Store
    engine_loop: EngineLoop
    engine: EngineInfo
    metrics: Metrics
    directing: set[SessionSocket] = field(default_factory=set)  # open directing sockets (limits.max_sessions)
    draining: bool = False  # SIGTERM: no new sockets or takes, running takes finish (backend/draining.py)
    closing: bool = False  # the server is stopping: late engine events are dropped, the store is closing
    sessions: dict[str, SessionSocket] = field(default_factory=dict)  # session id -> the socket that holds it
    conversations: ConversationLoop | None = None  # the PersonaPlex engine (`retake serve --converse`)
    db: StoreThread = field(default_factory=StoreThread)  # every store call goes through it (never the loop)

    @property
    def sockets(self) -> int:
        return len(self.directing)

    async def call(self, fn: Callable[[Drama3Engine], T]) -> T:
        """Run `fn(engine)` on the engine thread (raises QueueFull when the queue is full)."""
        job: CallJob[T] = CallJob(fn, asyncio.get_running_loop())
        self.engine_loop.submit(job)
        return await job.future

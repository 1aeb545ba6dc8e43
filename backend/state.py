"""What the whole server shares: settings, the store, the engine loop, metrics, open sessions.

It lives on `app.state.retake` and is only touched from the event loop thread (the engine
thread reaches the event loop through `call_soon_threadsafe`, never through this object).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from backend.loop import CallJob, EngineLoop
from backend.metrics import Metrics
from backend.settings import Settings
from backend.store import Store
from engine import Drama3Engine

if TYPE_CHECKING:
    from backend.conversation import ConversationLoop
    from backend.session import Session

T = TypeVar("T")


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
    sockets: int = 0  # open directing sockets (limits.max_sessions)
    closing: bool = False  # the server is stopping: late engine events are dropped, the store is closing
    sessions: dict[str, Session] = field(default_factory=dict)  # session id -> the socket that holds it
    conversations: ConversationLoop | None = None  # the PersonaPlex engine (`retake serve --converse`)

    async def call(self, fn: Callable[[Drama3Engine], T]) -> T:
        """Run `fn(engine)` on the engine thread (raises loop.Busy when the queue is full)."""
        job: CallJob[T] = CallJob(fn, asyncio.get_running_loop())
        self.engine_loop.submit(job)
        return await job.future

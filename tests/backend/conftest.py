"""Fixtures for the backend tests: the real engine on the tiny checkpoint, real servers, real SQLite
files. One engine loop serves every server of the test session (loading and warming the engine
once), and one shared server serves most tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import CONVERSATION_SLOTS, LiveServer

from backend.app import start_conversation_loop, start_engine_loop
from backend.conversation.loop import ConversationLoop
from backend.directing.jobs import SilenceGuard
from backend.directing.loop import EngineLoop
from backend.settings import Settings


@pytest.fixture(scope="session")
def engine_loop(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineLoop]:
    # Two slots (the CPU default, pinned here): takes of different sessions decode together.
    settings = Settings(data_dir=tmp_path_factory.mktemp("unused"), checkpoint=tiny_checkpoint, device="cpu",
                        slots=2)
    loop = start_engine_loop(settings)
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def make_server(engine_loop: EngineLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start a server with settings changes; every server started is stopped at the end."""
    servers: list[LiveServer] = []

    def start(data_dir: Path | None = None, **changes: Any) -> LiveServer:
        limits, send_buffer = changes.pop("limits", {}), changes.pop("send_buffer", None)
        conversations = changes.pop("conversations", None)
        settings = Settings(data_dir=data_dir or tmp_path_factory.mktemp("data"), device="cpu")
        settings = dataclasses.replace(settings, limits=dataclasses.replace(settings.limits, **limits), **changes)
        server = LiveServer(settings, engine_loop, send_buffer, conversations)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def conversations(personaplex_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[ConversationLoop]:
    """The tiny PersonaPlex engine on its loop, with CONVERSATION_SLOTS slots (loaded once)."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("unused"), device="cpu", conversation=personaplex_checkpoint,
                        conversation_slots=CONVERSATION_SLOTS)
    loop = start_conversation_loop(settings)
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def talk_server(make_server: Any, conversations: ConversationLoop) -> LiveServer:
    """A server with /converse (the shared conversation engine)."""
    return make_server(conversations=conversations)


@pytest.fixture(scope="session")
def server(make_server: Any) -> LiveServer:
    """The shared server (default settings, silence guard off so takes are what the engine made)."""
    return make_server(silence=SilenceGuard(retries=0))

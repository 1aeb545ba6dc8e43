"""A real server for the backend tests: uvicorn on 127.0.0.1 in a thread (see conftest.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from backend.app import build_app
from backend.conversation.loop import ConversationLoop
from backend.directing.loop import EngineLoop
from backend.http_server import uvicorn_config
from backend.settings import Settings

T = TypeVar("T")
RETAKE = [sys.executable, "-c", "import sys; from backend.cli import main; sys.exit(main())"]  # the console script
CONVERSATION_SLOTS = 2  # of the shared conversation engine (conftest.py)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Tests are plain functions that run one coroutine (no async test plugin needed)."""
    return asyncio.run(coroutine)


async def fetch(url: str, headers: dict[str, str] | None = None) -> bytes:
    """GET a URL's body from a coroutine, on a worker thread (urllib blocks)."""
    def get() -> bytes:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=60) as response:
            body: bytes = response.read()
            return body

    return await asyncio.to_thread(get)


class LiveServer:
    """uvicorn serving build_app(settings) on a free loopback port, in a thread."""

    def __init__(self, settings: Settings, engine_loop: EngineLoop, send_buffer: int | None = None,
                 conversations: ConversationLoop | None = None) -> None:
        self.settings = settings
        config = uvicorn_config(build_app(settings, engine_loop, conversations), settings, log_level="warning")
        listener = socket.socket()
        if send_buffer is not None:  # accepted sockets inherit it (and lose send-buffer autotuning)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        listener.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [listener]}, name="uvicorn",
                                       daemon=True)
        self.thread.start()
        started = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - started > 60:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.http = f"http://127.0.0.1:{port}"
        self.ws = f"ws://127.0.0.1:{port}/ws"
        self.converse = f"ws://127.0.0.1:{port}/converse"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve(checkpoint: Path, data_dir: Path, port: int, *options: str) -> subprocess.Popen[str]:
    """`retake serve` in its own process on the tiny checkpoint, once /health answers."""
    process = subprocess.Popen([*RETAKE, "serve", "--checkpoint", str(checkpoint), "--device", "cpu", "--port",
                                str(port), "--data-dir", str(data_dir), "--silence-retries", "0", *options],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return process
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "retake serve did not come up"
            time.sleep(0.25)


async def warms_ended(engine_loop: EngineLoop) -> None:
    """Wait until no prefix warm is asked for or running (a keep asks for one before its reply)."""
    for _ in range(600):
        if not engine_loop.warms_pending:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("a prefix warm did not end within a minute")

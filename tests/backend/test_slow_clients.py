"""Clients that hold the server without using it: one that stops reading (mid-take, or flooding
pings), one that never answers the keepalive ping, one that never opens its session; and
conversations that open together. Real servers, real sockets; the server must let go of each."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import websockets
from live_server import CONVERSATION_SLOTS, LiveServer, run
from raw_http import RawWebSocket

from backend.conversation.loop import ConversationLoop
from backend.directing.jobs import SilenceGuard
from backend.http_server import WebSocketProtocol
from backend.tools.conversation_load import user_voice

LONG_TAKE = {"type": "take.start", "line_id": "a", "text": "A long speech that goes on and on.",
             "sampling": {"max_new_tokens": 1200, "seed": 5}}
QUIET = {"silence": SilenceGuard(retries=0)}


def until(what: str, check: Callable[[], bool], seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:g} s for {what}")
        time.sleep(0.1)


def sessions(server: LiveServer) -> int:
    with urllib.request.urlopen(f"{server.http}/health", timeout=30) as response:
        return int(json.loads(response.read())["sessions"])


def websockets_of(server: LiveServer) -> list[WebSocketProtocol]:
    return [c for c in list(server.server.server_state.connections) if isinstance(c, WebSocketProtocol)]


def released(server: LiveServer) -> bool:
    return sessions(server) == 0 and not websockets_of(server)


@pytest.mark.parametrize("limits", [
    pytest.param({"send_timeout_s": 2.0, "keepalive_s": 600.0}, id="stops-reading-mid-take"),
    # uvicorn closes a connection that never answers the keepalive ping, and a close waits for the
    # client to read what was sent: forever. The connection is aborted instead.
    pytest.param({"send_timeout_s": 600.0, "keepalive_s": 1.0}, id="never-answers-the-keepalive-ping"),
])
def test_a_client_that_stops_reading_mid_take_is_dropped(make_server: Any, limits: dict[str, float]) -> None:
    """A client that stops reading while its take streams is dropped, by the send timeout or by
    the keepalive ping it never answers, and its session released."""
    server = make_server(send_buffer=8192, **limits, **QUIET)
    client = RawWebSocket(server.http, "/ws", receive_buffer=4096)
    client.text(json.dumps({"type": "session.open"}))
    client.text(json.dumps(LONG_TAKE))
    until("the session to start", lambda: sessions(server) == 1)
    until("the server to let the session and its connection go", lambda: released(server))
    client.close()


def test_pongs_to_a_client_that_does_not_read_do_not_pile_up(make_server: Any) -> None:
    server = make_server(send_buffer=8192, keepalive_s=600.0)
    client = RawWebSocket(server.http, "/ws", receive_buffer=4096)
    client.text(json.dumps({"type": "session.open"}))
    for _ in range(20_000):  # 2.5 MB of pongs if each were written
        client.ping(b"p" * 125)
    buffered: list[int] = []

    def settled() -> bool:
        connections = websockets_of(server)
        buffered.append(max((c.transport.get_write_buffer_size() for c in connections), default=0))
        return len(buffered) > 30 and len(set(buffered[-30:])) == 1  # unchanged for 3 s: every ping is read

    until("the server to read every ping", settled)
    assert max(buffered) < 512 * 1024, max(buffered)
    client.close()


def test_a_flood_of_pings_that_are_never_read_drops_the_socket(make_server: Any) -> None:
    """The pongs of JSON pings wait in the socket's outbox: past MAX_MESSAGES the socket is
    dropped (long before the send timeout, set far away here)."""
    server = make_server(send_buffer=8192, send_timeout_s=600.0, keepalive_s=600.0)
    client = RawWebSocket(server.http, "/ws", receive_buffer=4096)
    client.text(json.dumps({"type": "session.open"}))
    for t in range(3000):
        client.text(json.dumps({"type": "ping", "t": t, "ref": "x" * 100}))
    until("the server to let the session and its connection go", lambda: released(server))
    client.close()


def test_a_socket_that_never_opens_a_session_is_closed(make_server: Any, conversations: ConversationLoop) -> None:
    server = make_server(open_timeout_s=1.0, conversations=conversations)

    async def main() -> None:
        directing = await websockets.connect(server.ws)
        error = json.loads(await asyncio.wait_for(directing.recv(), 60))
        assert error["code"] == "session_not_open" and "within 1 s" in error["message"], error
        await directing.wait_closed()
        assert directing.close_code == 1008
        talking = await websockets.connect(server.converse)
        error = json.loads(await asyncio.wait_for(talking.recv(), 60))
        assert error["code"] == "bad_field" and "no converse.open within 1 s" in error["message"], error
        await talking.wait_closed()
        assert talking.close_code == 1008
        # A socket that opens in time stays open past the timeout.
        opened = await websockets.connect(server.ws)
        await opened.send(json.dumps({"type": "session.open"}))
        assert json.loads(await opened.recv())["type"] == "session.ready"
        await asyncio.sleep(1.5)
        await opened.send(json.dumps({"type": "ping", "t": 1}))
        assert json.loads(await opened.recv())["type"] == "pong"
        await opened.close()

    run(main())


def test_conversations_opening_together_never_share_a_slot(talk_server: LiveServer,
                                                           conversations: ConversationLoop) -> None:
    """With a voice clip a conversation's start takes a while on the engine thread; another
    open in that time must not be given the same slot."""
    buffer = io.BytesIO()
    sf.write(buffer, user_voice(1.5, 24000, 3).astype(np.float32) / 32768, 24000, format="WAV")
    clip = base64.b64encode(buffer.getvalue()).decode()
    until("earlier conversations to end", lambda: conversations.active == 0)

    async def open_one(delay_s: float) -> tuple[Any, dict[str, Any]]:
        await asyncio.sleep(delay_s)
        socket = await websockets.connect(talk_server.converse, max_size=None)
        await socket.send(json.dumps({"type": "converse.open", "voice_clip": clip, "persona": "Be brief."}))
        return socket, json.loads(await socket.recv())

    async def main() -> None:
        opened = await asyncio.gather(*(open_one(0.02 * k) for k in range(CONVERSATION_SLOTS + 2)))
        kinds = sorted(reply["type"] if reply["type"] != "error" else reply["code"] for _, reply in opened)
        assert kinds == ["busy"] * 2 + ["converse.ready"] * CONVERSATION_SLOTS, kinds
        for socket, _ in opened:
            await socket.close()

    run(main())
    until("the conversations to end", lambda: conversations.active == 0)

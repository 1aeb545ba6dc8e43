"""SIGTERM drains a replica (backend/draining.py): /health says 503 draining, idle and new sockets
are closed with 1012 (reconnect elsewhere), a new take is refused, the running take plays to its
end and then its socket is closed with 1012, and the server exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.error
import urllib.request

import pytest
from live_server import fetch, run, serve
from test_commands import free_port
from websockets.exceptions import ConnectionClosed

from backend.tools.client import AudioFrame, Director


def health(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def close_code(director: Director) -> int:
    """Read until the server closes the socket; its close code."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await director.receive()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


@pytest.mark.slow
def test_sigterm_drains_the_replica(tiny_checkpoint, tmp_path) -> None:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    server = serve(tiny_checkpoint, tmp_path, port, "--drain-seconds", "300")
    try:
        status, body = health(port)
        assert status == 200 and body["status"] == "ok" and body["pid"] == server.pid

        async def main() -> None:
            talker, idle = await Director.connect(url), await Director.connect(url)
            await talker.open()
            await idle.open()
            take = await talker.start("l1", "A long speech that goes on.", sampling={"seed": 11, "max_new_tokens": 120})
            while not isinstance(await talker.receive(), AudioFrame):  # it runs
                pass
            server.send_signal(signal.SIGTERM)
            assert await close_code(idle) == 1012
            status, body = await asyncio.to_thread(health, port)
            assert (status, body["status"]) == (503, "draining")
            assert "retake_draining 1" in (await fetch(f"http://127.0.0.1:{port}/metrics")).decode()
            newcomer = await Director.connect(url)
            assert await close_code(newcomer) == 1012
            refused = await talker.start("l2", "One more?")
            assert (refused.messages[0]["type"], refused.messages[0]["code"]) == ("error", "draining")
            result = await talker.finish(take)
            assert result.done["finish_reason"] == "length" and len(result.frames) > 0
            assert await close_code(talker) == 1012

        run(main())
        assert server.wait(timeout=120) == 0
    finally:
        server.kill()
        server.wait(timeout=30)

"""Bad input on a real socket: every case gets an `error` with its code, and the socket stays usable."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import websockets
from live_server import LiveServer, run

from backend.tools.client import Director

INVALID = json.loads((Path(__file__).parents[2] / "fixtures" / "protocol" / "invalid_client_messages.json").read_text())


async def still_usable(director: Director) -> None:
    pong = await director.request({"type": "ping", "t": 7.5, "ref": "alive"}, "pong")
    assert (pong["t"], pong["ref"]) == (7.5, "alive")


@pytest.mark.parametrize("sample", INVALID, ids=lambda s: s["name"])
def test_invalid_messages_table(server: LiveServer, sample: dict[str, Any]) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await director.socket.send(sample["text"])
        error = await director.expect("error")
        assert (error["code"], error["message"]) == (sample["code"], sample["message"])
        await still_usable(director)
        await director.close()

    run(main())


def test_protocol_order_and_unknown_ids(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        error = await director.request({"type": "take.start", "line_id": "a", "text": "Hi.", "ref": "early"}, "error")
        assert (error["code"], error["ref"]) == ("session_not_open", "early")
        error = await director.request({"type": "session.open", "session_id": "0" * 32}, "error")
        assert error["code"] == "unknown_session"
        await director.socket.send(b"\x01\x00\x00\x00")
        assert (await director.expect("error"))["code"] == "binary_not_supported"
        await director.open()
        assert (await director.request({"type": "session.open"}, "error"))["code"] == "session_already_open"
        for kind in ("take.cancel", "take.keep", "take.drop"):
            error = await director.request({"type": kind, "take_id": 999999, "ref": kind}, "error")
            assert (error["code"], error["take_id"], error["ref"]) == ("unknown_take", 999999, kind)
        error = await director.request({"type": "take.start", "line_id": "a", "text": "Hi.", "history": [999999],
                                        "ref": "h"}, "error")
        assert (error["code"], error["ref"]) == ("unknown_take", "h")
        await still_usable(director)
        await director.close()

    run(main())


def test_takes_that_cannot_be_kept(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        # The engine refuses this text (only speaker 0 is supported): the take ends with error.
        refused = await director.take("a", "<|speaker:1|> Not me.", sampling={"max_new_tokens": 4})
        done = refused.done
        assert done["finish_reason"] == "error" and "speaker" in str(done["error"]) and done["frames"] == 0
        error = await director.request({"type": "take.keep", "take_id": refused.take_id}, "error")
        assert error["code"] == "take_not_usable"
        error = await director.request({"type": "take.start", "line_id": "b", "text": "Hi.",
                                        "history": [refused.take_id]}, "error")
        assert error["code"] == "take_not_usable"
        running = await director.start("a", "A long speech that goes on.", sampling={"seed": 11})
        error = await director.request({"type": "take.keep", "take_id": running.take_id}, "error")
        assert error["code"] == "take_not_finished"
        await director.send({"type": "take.cancel", "take_id": running.take_id})
        await director.finish(running)
        await still_usable(director)
        await director.close()

    run(main())


def test_oversized_messages(make_server: Any) -> None:
    server = make_server(limits={"max_message_bytes": 4096})

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await director.send({"type": "ping", "ref": "x", "pad": "y" * 5000})
        assert (await director.expect("error"))["code"] == "message_too_big"
        await still_usable(director)
        # Past the transport limit (max_message_bytes + 1 MiB) the server closes the socket with 1009.
        # The server may close while our send still drains; then send itself reports the close.
        with contextlib.suppress(websockets.exceptions.ConnectionClosed):
            await director.socket.send("z" * (4096 + 2**20 + 1))
        await director.socket.wait_closed()
        assert director.socket.close_code == 1009

    run(main())


def test_a_client_that_keeps_breaking_the_protocol_is_closed(make_server: Any) -> None:
    server = make_server(limits={"max_protocol_errors": 3})

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        for _ in range(2):
            await director.socket.send("{oops")
            assert (await director.expect("error"))["code"] == "bad_json"
        await director.request({"type": "take.keep", "take_id": 424242}, "error")  # not a protocol error
        await director.socket.send("{oops")
        assert (await director.expect("error"))["code"] == "bad_json"
        await director.socket.wait_closed()
        assert director.socket.close_code == 1008

    run(main())

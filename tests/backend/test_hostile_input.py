"""Input that once crashed a handler (1011 on /ws, a dropped socket on /converse, 500 on HTTP): each
now gets bad_json or bad_field (400 on HTTP), and the socket stays usable."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import pytest
import websockets
from live_server import LiveServer, run
from raw_http import request

from backend.tools.client import Director

HUGE_INTEGER = "1" * 5000  # more digits than Python's int() takes from text
# (name, the text frame or body, the code on /ws). Built as text: json.dumps cannot write most of them.
HOSTILE = [
    ("an integer of 5,000 digits", '{"type": "ping", "t": ' + HUGE_INTEGER + "}", "bad_json"),
    ("an integer too large for a float", '{"type": "ping", "t": 1' + "0" * 400 + "}", "bad_field"),
    ("a float too large", '{"type": "ping", "t": 1e400}', "bad_field"),
    ("NaN", '{"type": "ping", "t": NaN}', "bad_json"),
    ("-Infinity", '{"type": "ping", "t": -Infinity}', "bad_json"),
    ("nesting 100,000 deep", '{"type": "ping", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "bad_json"),
    ("nesting 1,000 deep", '{"type": "ping", "x": ' + "[" * 1000 + "]" * 1000 + "}", "bad_json"),
    ("a lone surrogate in a value", '{"type": "line.set", "line_id": "a", "text": "\\ud800"}', "bad_json"),
    ("a lone surrogate in a key", '{"type": "ping", "\\udfff": 1}', "bad_json"),
    ("a lone surrogate in a take", '{"type": "take.start", "line_id": "\\udc80", "text": "Hi."}', "bad_json"),
]


@pytest.mark.parametrize(("name", "text", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_directing_socket(server: LiveServer, name: str, text: str, code: str) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await director.socket.send(text)
        error = await director.expect("error")
        assert error["code"] == code, error
        pong = await director.request({"type": "ping", "t": 1}, "pong")
        assert pong["t"] == 1
        await director.close()

    run(main())


def test_a_surrogate_pair_is_text(server: LiveServer) -> None:
    """An escaped pair (an emoji) is fine; only a lone half is refused."""
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await director.socket.send('{"type": "line.set", "line_id": "a", "text": "\\ud83c\\udfac Action!"}')
        script = await director.expect("script")
        assert script["lines"][0]["text"] == "\U0001f3ac Action!"
        await director.close()

    run(main())


@pytest.mark.parametrize(("name", "text", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_conversation_socket(talk_server: LiveServer, name: str, text: str, code: str) -> None:
    """Before converse.open every refusal is bad_field (the client may open again); after it, the
    codes of the protocol."""
    async def main() -> None:
        socket: Any = await websockets.connect(talk_server.converse, max_size=None)
        await socket.send(text.replace('"ping"', '"converse.open"').replace('"t":', '"seed":'))
        reply = json.loads(await socket.recv())
        assert reply["type"] == "error" and reply["code"] == "bad_field", reply
        await socket.send(json.dumps({"type": "converse.open"}))
        assert json.loads(await socket.recv())["type"] == "converse.ready"
        await socket.send(text)
        while (reply := json.loads(await socket.recv()))["type"] not in ("error", "pong"):
            pass  # converse.listening, the agent's text
        # A ping's fields are not read (a ping of huge numbers is a ping); the rest is refused.
        expected = ("pong",) if code == "bad_field" else ("error",)
        assert reply["type"] in expected and reply.get("code", "bad_json") in ("bad_json", "unknown_type"), reply
        await socket.send(json.dumps({"type": "ping"}))
        while json.loads(await socket.recv())["type"] != "pong":
            pass
        await socket.close()

    run(main())


@pytest.mark.parametrize(("name", "text", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_speech_api(server: LiveServer, name: str, text: str, code: str) -> None:
    body = (text.replace('"type": "ping"', '"input": "Hi.", "max_new_tokens": 2').replace('"t":', '"temperature":')
            .replace('"type": "line.set"', '"input": "Hi."'))
    status, _, reply = request(server.http, "POST", "/v1/audio/speech", {"Content-Type": "application/json"},
                               body.encode())
    assert status == 400, reply
    assert json.loads(reply)["error"]["type"] == "invalid_request_error"
    # The same inside the speech envelope.
    envelope = "@@drama3-space@@" + text
    status, _, reply = request(server.http, "POST", "/v1/audio/speech", {"Content-Type": "application/json"},
                               json.dumps({"input": envelope}).encode())
    assert status == 400, reply


def test_numbers_that_only_look_like_digits(server: LiveServer) -> None:
    async def session() -> str:
        director = await Director.connect(server.ws)
        ready = await director.open()
        await director.close()
        return str(ready["session_id"])

    session_id = run(session())
    for raw in ("%C2%B2", "%D9%A3", "1%C2%B2", "-1", "99999999999999"):  # ², Arabic-Indic 3
        status, _, reply = request(server.http, "GET", f"/sessions/{session_id}/takes/{raw}.wav",
                                   Director.export_headers(session_id))
        assert status == 404, (raw, reply)


class Records(logging.Handler):
    """Every log record while installed, from the root logger and uvicorn's (which does not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> Records:
        for name in ("", "uvicorn", "uvicorn.error"):
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("", "uvicorn", "uvicorn.error"):
            logging.getLogger(name).removeHandler(self)


def test_a_text_frame_that_is_not_utf8_closes_the_socket_without_a_traceback(server: LiveServer) -> None:
    """1007 and one log line, no traceback. (A send that races the close, the take's next window,
    would log `RuntimeError: Unexpected ASGI message` without backend/http_server.py; whether
    one races depends on the timing, so this only catches it when it does.)"""
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await director.start("a", "A long speech that goes on.", sampling={"seed": 11}, length_guard=False)
        await director.expect("take.started")
        await director.socket.send(b'{"type": "ping", "t": "\xff\xfe"}', text=True)
        with contextlib.suppress(websockets.exceptions.ConnectionClosed):
            while True:
                await director.socket.recv()  # the take's audio, until the close
        assert director.socket.close_code == 1007
        again = await Director.connect(server.ws)  # the server goes on
        await again.open()
        await again.request({"type": "ping", "t": 1}, "pong")
        await again.close()

    with Records() as log:
        run(main())
    said = [record.getMessage() for record in log.records]
    assert not [record for record in log.records if record.exc_info], said
    assert not [text for text in said if "Unexpected ASGI message" in text or "Traceback" in text], said

"""A seeded fuzz of the three sockets (/ws, /converse, /api/chat) and the HTTP API on a real server:
valid messages with fields dropped, retyped, oversized or made hostile (huge and lone-surrogate
values, deep nesting, binary frames, garbage audio), sent in a stream. The server must never
answer 500, never close a socket with 1011 or without a close frame, never leave a message
unanswered (a ping after each one must come back), and must still direct a take afterwards.

The generator is seeded (FUZZ_SEED, default 20) and bounded (FUZZ_MESSAGES per socket), so a
failure names the message that caused it and reruns the same way."""

from __future__ import annotations

import base64
import io
import json
import os
import random
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import websockets
from live_server import LiveServer, run
from raw_http import request
from websockets.exceptions import ConnectionClosed

from backend.directing.jobs import SilenceGuard
from backend.tools.client import Director

SEED = int(os.environ.get("FUZZ_SEED", "20"))
MESSAGES = int(os.environ.get("FUZZ_MESSAGES", "120"))
PATIENCE_S = 120  # a reply to the ping after each message; a hang fails here
SHORT_TAKES = {"max_new_tokens": 8}  # the fuzz server's limit: a take the fuzz starts is over in seconds
CLEAN_CLOSES = (1000, 1007, 1008, 1009, 1013)  # the server's deliberate closes (after an error that says why)


def clip(seconds: float = 0.3) -> str:
    out = io.BytesIO()
    sf.write(out, np.zeros(int(16000 * seconds), dtype=np.float32), 16000, format="WAV")
    return base64.b64encode(out.getvalue()).decode()


def odd_value(rng: random.Random) -> Any:
    """A JSON value of an unexpected kind or size."""
    return rng.choice([
        None, True, False, 0, -1, 2**31, 2**63, -(2**64), 10**40, 1.5, -0.0, 1e308, "", "x" * rng.randint(1, 3000),
        "²", "٣", "😀", "\u202e", "a\nb", [], {}, [1, [2, [3]]], {"a": {"b": {"c": 1}}}, ["line"] * 50,
        {"audio": "not base64!", "text": "t"}, [{"audio": clip(), "text": 5}],
    ])


# Raw text frames json.dumps cannot write, or writes only as something else.
HOSTILE_TEXT = [
    '{"type": "ping", "t": ' + "9" * 5000 + "}",
    '{"type": "ping", "t": 1' + "0" * 400 + "}",
    '{"type": "ping", "t": NaN}',
    '{"type": "line.set", "line_id": "a", "text": "\\ud800"}',
    '{"type": "ping", "x": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"type": "take.start", "line_id": "a", "text": "Hi.", "sampling": {"top_k": 1e400}}',
    "not json at all",
    "",
    "[]",
    '"a string"',
    '{"type": "converse.open", "persona": "\\udfff"}',
]

DIRECTING = [
    {"type": "line.set", "line_id": "l1", "text": "Hello there."},
    {"type": "line.set", "line_id": "l2", "text": "And again.", "after": "l1", "character_id": None},
    {"type": "line.delete", "line_id": "l2"},
    {"type": "line.order", "line_ids": ["l1"]},
    {"type": "take.start", "line_id": "l1", "text": "Hello there.", "sampling": {"max_new_tokens": 4, "seed": 1}},
    {"type": "take.cancel", "take_id": 1},
    {"type": "take.keep", "take_id": 1},
    {"type": "take.drop", "take_id": 1},
    {"type": "take.note", "take_id": 1, "note": "ok", "rating": 3},
    {"type": "voice.set", "character": {"name": "Ada", "description": "calm"}},
    {"type": "voice.set", "references": [{"audio": clip(), "text": "Hi."}]},
    {"type": "cast.set", "character_id": "a", "name": "Ada", "voice": {"description": "warm"}},
    {"type": "cast.delete", "character_id": "a"},
    {"type": "session.open"},
    {"type": "ping", "t": 1},
]


def mutated(rng: random.Random, base: dict[str, Any]) -> str:
    """A message made wrong one way or another (or left as it is, now and then)."""
    message = json.loads(json.dumps(base))
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(HOSTILE_TEXT)
    if roll < 0.25 and len(message) > 1:
        message.pop(rng.choice([k for k in message if k != "type"]))
    elif roll < 0.55:
        message[rng.choice(list(message))] = odd_value(rng)
    elif roll < 0.65:
        message[rng.choice(["extra", "ref", "session_key", "audio", "history", "deadline_ms"])] = odd_value(rng)
    elif roll < 0.75:
        message["type"] = rng.choice(["", "take", "take.start ", "TAKE.START", "session.close", "voice.set.x"])
    elif roll < 0.85 and message.get("type") == "take.start":
        message["history"] = rng.choice(["kept", [], [1, 2, 3], [2**40], "all", [-1]])
    return json.dumps(message, ensure_ascii=rng.random() < 0.5)


async def answered(socket: Any, ping: str, until: str) -> list[dict[str, Any]]:
    """Read until the reply of type `until` to our ping comes back; every JSON message on the way."""
    seen: list[dict[str, Any]] = []
    await socket.send(ping)
    async with asyncio_timeout(PATIENCE_S):
        while True:
            frame = await socket.recv()
            if isinstance(frame, bytes):
                continue  # audio
            message = json.loads(frame)
            seen.append(message)
            if message.get("type") == until:
                return seen


def asyncio_timeout(seconds: float) -> Any:
    import asyncio

    return asyncio.timeout(seconds)


def assert_clean_close(socket: Any, after: str) -> None:
    """A close frame of the server's own codes (never 1011, never a dropped connection: 1006)."""
    code = socket.close_code
    assert code in CLEAN_CLOSES, (code, socket.close_reason, after[:200])


def no_fault(messages: list[dict[str, Any]], after: str) -> None:
    for message in messages:
        assert message.get("code") != "internal", (message, after[:200])
        text = str(message.get("message", ""))
        assert "Traceback" not in text and " object at 0x" not in text, (message, after[:200])


@pytest.fixture(scope="module")
def server(make_server: Any) -> LiveServer:
    """A server whose takes are at most 8 frames (a fuzzed take.start or speech request may ask for more)."""
    return make_server(limits=SHORT_TAKES, silence=SilenceGuard(retries=0))


@pytest.mark.slow
def test_fuzz_directing_socket(server: LiveServer) -> None:
    rng = random.Random(SEED)

    async def main() -> None:
        socket: Any = None
        for index in range(MESSAGES):
            if socket is None:
                socket = await websockets.connect(server.ws, max_size=None)
                opened = await answered(socket, json.dumps({"type": "session.open", "ref": "open"}), "session.ready")
                no_fault(opened, "session.open")
            if rng.random() < 0.05:
                sent: str | bytes = rng.randbytes(rng.randint(0, 64))
            else:
                sent = mutated(rng, rng.choice(DIRECTING))
            try:
                await socket.send(sent)
                replies = await answered(socket, json.dumps({"type": "ping", "t": index}), "pong")
            except ConnectionClosed:
                assert_clean_close(socket, repr(sent))
                socket = None
                continue
            no_fault(replies, repr(sent))
        if socket is not None:
            await socket.close()
        # Still a server: a new director takes a line.
        director = await Director.connect(server.ws)
        await director.open()
        take = await director.take("after", "Still here.", sampling={"max_new_tokens": 4, "seed": 2})
        assert take.done["finish_reason"] in ("stop", "length")
        await director.close()

    run(main())


CONVERSING = [
    {"type": "converse.open"},
    {"type": "converse.open", "persona": "You are kind.", "voice": "NATF2", "seed": 3},
    {"type": "converse.open", "voice_clip": clip(1.0)},
    {"type": "ping"},
    {"type": "converse.close"},
]


@pytest.mark.slow
def test_fuzz_conversation_sockets(talk_server: LiveServer) -> None:
    rng = random.Random(SEED + 1)
    base = talk_server.http.replace("http", "ws")

    async def converse() -> None:
        for index in range(MESSAGES // 20):
            socket: Any = await websockets.connect(talk_server.converse, max_size=None)
            sent: str | bytes = ""
            try:
                for _ in range(4):
                    if rng.random() < 0.2:
                        sent = rng.randbytes(rng.randint(0, 4000))  # audio that is not 80 ms of float32
                    else:
                        sent = mutated(rng, rng.choice(CONVERSING))
                    await socket.send(sent)
                    replies = await answered(socket, json.dumps({"type": "ping", "ref": str(index)}), "pong")
                    no_fault(replies, repr(sent))
            except ConnectionClosed:
                assert_clean_close(socket, repr(sent))
            finally:
                await socket.close()

    async def chat() -> None:
        for _ in range(MESSAGES // 60):
            query = rng.choice(["", "?text_prompt=Hi", "?voice_prompt=NOPE.pt", "?seed=" + "9" * 400,
                                "?seed=x", "?text_prompt=" + "a" * 5000, "?voice_prompt=%00", "?seed=-1"])
            socket: Any = await websockets.connect(f"{base}/api/chat{query}", max_size=None)
            try:
                for _ in range(3):
                    kind = rng.choice([1, 1, 3, 4, 6, 9, 255])
                    await socket.send(bytes([kind]) + rng.randbytes(rng.randint(0, 2000)))
                async with asyncio_timeout(PATIENCE_S):
                    while True:  # it answers with a handshake, audio, text or an error and a close
                        frame = await socket.recv()
                        assert isinstance(frame, bytes), frame[:40]
                        assert frame[:1] in (b"\x00", b"\x01", b"\x02", b"\x05"), frame[:40]
                        if frame[:1] == b"\x05":
                            assert b"Traceback" not in frame and b" object at 0x" not in frame, frame
                            break
                        if frame[:1] == b"\x00":
                            break
            except ConnectionClosed:
                assert_clean_close(socket, query)
            finally:
                await socket.close()

    run(converse())
    run(chat())
    status, _, body = request(talk_server.http, "GET", "/health")
    assert status == 200 and json.loads(body)["converse"] is True


ROUTES = [
    ("POST", "/v1/audio/speech", {"input": "Hi.", "max_new_tokens": 2}),
    ("POST", "/v1/audio/speech", {"input": "Hi.", "response_format": "wav", "speed": 1.0, "voice": "default"}),
    ("POST", "/v1/audio/voices", {"name": "Fuzz", "character": {"name": "F", "description": "d"}}),
    ("GET", "/v1/audio/voices", None),
    ("DELETE", "/v1/audio/voices/Fuzz", None),
    ("POST", "/sessions", {"name": "Fuzzed"}),
    ("POST", "/sessions/list", {"sessions": [{"session_id": "x", "session_key": "y"}]}),
    ("PATCH", "/sessions/x", {"name": "y"}),
    ("POST", "/sessions/x/duplicate", {}),
    ("GET", "/sessions/x/takes/1.wav", None),
    ("GET", "/converse/info", None),
    ("GET", "/metrics", None),
    ("POST", "/auth", None),
]


@pytest.mark.slow
def test_fuzz_http_api(server: LiveServer) -> None:
    rng = random.Random(SEED + 2)
    for _ in range(MESSAGES * 2):
        method, path, body = rng.choice(ROUTES)
        if rng.random() < 0.3:
            path = path.replace("x", rng.choice(["%C2%B2", "..", "%00", "9" * 300, "%F0%9F%98%80", "x/../../etc"]))
        raw: bytes | None = None
        if body is not None:
            raw = (mutated(rng, {"type": "x", **body}).encode("utf-8", "surrogatepass") if rng.random() < 0.8
                   else rng.randbytes(rng.randint(0, 300)))
        headers = {"Content-Type": rng.choice(["application/json", "application/json; charset=utf-8",
                                               "multipart/form-data; boundary=zz", "application/octet-stream"])}
        if rng.random() < 0.1:
            headers["Retake-Session-Key"] = rng.choice(["", "k" * 5000, "\u00e9"]).encode("utf-8").decode("latin-1")
        status, _, reply = request(server.http, method, path, headers, raw)
        assert status < 500 or status == 503, (status, method, path, raw[:200] if raw else None, reply[:300])
        assert b"Traceback" not in reply and b" object at 0x" not in reply, reply[:300]
    status, _, _ = request(server.http, "POST", "/v1/audio/speech", {"Content-Type": "application/json"},
                           json.dumps({"input": "Fine.", "max_new_tokens": 2}).encode())
    assert status == 200

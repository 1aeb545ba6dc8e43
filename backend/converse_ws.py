"""The `/converse` endpoint: a live, full-duplex conversation with PersonaPlex (docs/protocol.md §9).

- Admission as on `/ws` (origin, token), then `converse.open` until one succeeds: a bad persona
  or an unknown voice is an `error` and the client may try again; a server with every slot in
  use answers `busy` and closes with 1013.
- Two tasks under one TaskGroup: `receive` hands the user's binary audio to the conversation
  loop and answers `ping`; `send` drains the outbox the engine thread fills (through the
  sink's callbacks on the event loop). Whatever ends either task frees the slot.
- The conversation messages are plain dicts here: they are few, flat and server-only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Any

import numpy as np
from starlette import status
from starlette.websockets import WebSocket, WebSocketDisconnect

from backend import protocol as p
from backend.conversation import Busy, Conversation, ConversationLoop, TooFast
from backend.state import ServerState
from backend.ws import origin_allowed, token_ok
from engine.errors import RequestError
from engine.personaplex import DEFAULT_PERSONA

MAX_OUTBOX = 1000  # messages waiting for a client that does not read (80 s of agent audio)
MAX_PERSONA_CHARS = 4000


class Closed(Exception):
    """Ends the conversation: the client left, or the server closes the socket (code, reason)."""

    def __init__(self, code: int = status.WS_1000_NORMAL_CLOSURE) -> None:
        super().__init__(code)
        self.code = code


def error(code: str, message: str) -> str:
    return json.dumps({"type": "error", "code": code, "message": message})


class SocketSink:
    """The engine thread's callbacks (run on the event loop): messages into the outbox."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self.outbox: asyncio.Queue[str | bytes | Closed] = asyncio.Queue()

    def put(self, item: str | bytes | Closed) -> None:
        if self.outbox.qsize() >= MAX_OUTBOX:
            item = Closed(status.WS_1008_POLICY_VIOLATION)  # the client stopped reading
        self.outbox.put_nowait(item)

    def listening(self) -> None:
        self.put(json.dumps({"type": "converse.listening"}))

    def frame(self, tick: int, pcm: np.ndarray, text: str | None) -> None:
        pcm16 = np.round(np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()  # [frame_samples]
        self.put(p.pack_audio_frame(0, tick, tick * self.frame_samples, pcm16, last=False))
        if text is not None:
            self.put(json.dumps({"type": "converse.text", "tick": tick, "text": text}))

    def failed(self, message: str) -> None:
        self.put(error("internal", message))
        self.put(Closed(status.WS_1011_INTERNAL_ERROR))


def parse_open(text: str) -> tuple[str | None, str | None, int | None, bytes | None]:
    """persona, voice, seed and voice clip of a `converse.open` (RequestError says what is wrong)."""
    try:
        message: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("type") != "converse.open":
        raise RequestError('the first message must be {"type": "converse.open"}')
    persona, voice, seed = message.get("persona"), message.get("voice"), message.get("seed")
    if persona is not None and (not isinstance(persona, str) or len(persona) > MAX_PERSONA_CHARS):
        raise RequestError(f"persona must be a string of at most {MAX_PERSONA_CHARS} characters")
    if voice is not None and not isinstance(voice, str):
        raise RequestError("voice must be a voice name (a string)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise RequestError("seed must be a non-negative integer")
    clip = message.get("voice_clip")
    if clip is not None:
        if voice is not None:
            raise RequestError("give a voice or a voice_clip, not both")
        try:
            clip = base64.b64decode(clip, validate=True) if isinstance(clip, str) else None
        except (binascii.Error, ValueError):
            clip = None
        if not clip:
            raise RequestError("voice_clip must be a WAV or FLAC file, base64-encoded")
    return persona, voice, seed, clip


async def converse_socket(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.retake
    if not origin_allowed(websocket.headers, websocket.url.scheme, state.settings) or not token_ok(
            websocket.headers, websocket.query_params, state.settings):
        await websocket.close(status.WS_1008_POLICY_VIOLATION)  # before accept: HTTP 403
        return
    await websocket.accept()
    conversations = state.conversations
    if conversations is None:
        await websocket.send_text(error("converse_off", "this server runs no conversation engine; start it with "
                                                        "retake serve --converse"))
        await websocket.close(status.WS_1008_POLICY_VIOLATION)
        return
    sink = SocketSink(conversations.frame_samples)
    try:
        talk = await open_conversation(websocket, conversations, sink)
    except (WebSocketDisconnect, Closed, OSError):  # OSError: uvicorn's ClientDisconnected on a send
        return
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(receive(websocket, conversations, talk))
            tasks.create_task(send(websocket, sink))
    except* (WebSocketDisconnect, OSError):  # the client left (OSError: uvicorn's ClientDisconnected on a send)
        pass
    except* Closed as group:
        closed = group.exceptions[0]
        assert isinstance(closed, Closed)
        try:
            await websocket.close(closed.code)
        except RuntimeError:  # already closed
            pass
    finally:
        conversations.leave(talk)


async def open_conversation(websocket: WebSocket, conversations: ConversationLoop, sink: SocketSink,
                            ) -> Conversation:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        try:
            if message.get("text") is None:
                raise RequestError("send converse.open (a text frame) before any audio")
            persona, voice, seed, clip = parse_open(message["text"])
            talk = await conversations.join(persona, voice, seed, sink, clip)
        except RequestError as exc:
            await websocket.send_text(error("bad_field", str(exc)))
            continue
        except Busy as exc:
            await websocket.send_text(error("busy", str(exc)))
            await websocket.close(status.WS_1013_TRY_AGAIN_LATER)
            raise Closed(status.WS_1013_TRY_AGAIN_LATER) from None
        engine = conversations.engine
        assert engine is not None
        try:
            await websocket.send_text(json.dumps({
                "type": "converse.ready", "sample_rate": engine.sample_rate, "frame_samples": engine.frame_size,
                "voice": talk.voice, "voices": conversations.voices,
                "persona": DEFAULT_PERSONA if persona is None else persona,
                "demo_weights": bool(engine.demo_weights)}))
        except BaseException:  # the client left while its slot started: free it
            conversations.leave(talk)
            raise
        return talk


async def receive(websocket: WebSocket, conversations: ConversationLoop, talk: Conversation) -> None:
    sink = talk.sink
    assert isinstance(sink, SocketSink)
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if message.get("bytes") is not None:
            try:
                conversations.feed(talk, message["bytes"])
            except RequestError as exc:
                sink.put(error("bad_field", str(exc)))
            except TooFast as exc:
                sink.put(error("too_fast", str(exc)))
                sink.put(Closed(status.WS_1008_POLICY_VIOLATION))
            continue
        try:
            kind = json.loads(message.get("text") or "").get("type")
        except (json.JSONDecodeError, AttributeError):
            sink.put(error("bad_json", "text frames must be JSON objects"))
            continue
        if kind == "ping":
            sink.put(json.dumps({"type": "pong"}))
        else:
            sink.put(error("unknown_type", f"unknown message type {kind!r} (the conversation takes ping and audio)"))


async def send(websocket: WebSocket, sink: SocketSink) -> None:
    while True:
        item = await sink.outbox.get()
        if isinstance(item, Closed):
            raise item
        if isinstance(item, bytes):
            await websocket.send_bytes(item)
        else:
            await websocket.send_text(item)

"""A small asyncio directing client (the `websockets` library): `retake loadtest` and the tests use it.

Design choices:
- It lives apart from the server (backend/tools/) and imports only the wire format
  (backend/transport.py), so it is a client like any other.
- It speaks docs/protocol.md and records when each audio frame arrived, so callers can
  measure first-audio latency and the gaps a player would hear. It checks nothing it need
  not: a test asserts on what it returns.
- Messages that arrive while a caller waits for another kind are kept, in order, for later
  calls; each message is waited for at most `patience_s`, so a stuck server fails a test
  instead of hanging it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Origin

from backend.transport import AudioHeader, unpack_audio_frame

JsonMessage = dict[str, object]


@dataclass
class AudioFrame:
    header: AudioHeader
    pcm: np.ndarray  # int16 [N]
    arrived: float  # time.monotonic()


@dataclass
class TakeResult:
    take_id: int
    sent: float  # time.monotonic() when take.start was sent
    queued_at: float  # time.monotonic() when its take.queued (or the error) arrived
    messages: list[JsonMessage] = field(default_factory=list)  # every JSON message of the take, in order
    frames: list[AudioFrame] = field(default_factory=list)  # audio of the last attempt
    all_frames: list[AudioFrame] = field(default_factory=list)  # audio of every attempt

    @property
    def done(self) -> JsonMessage:
        return next(m for m in self.messages if m["type"] == "take.done")

    @property
    def pcm(self) -> np.ndarray:
        return np.concatenate([f.pcm for f in self.frames]) if self.frames else np.zeros(0, np.int16)

    def of_type(self, kind: str) -> list[JsonMessage]:
        return [m for m in self.messages if m["type"] == kind]


class Director:
    """One directing socket. Like the studio's localStorage, the class remembers the key of every
    session its sockets made (`keys`), so a later `open(session_id)` in this process resumes it."""

    keys: ClassVar[dict[str, str]] = {}  # session id -> its key

    def __init__(self, socket: ClientConnection, patience_s: float = 60.0) -> None:
        self.socket = socket
        self.patience_s = patience_s  # how long to wait for each message before giving up (TimeoutError)
        self.pending: list[JsonMessage | AudioFrame] = []  # received but not yet consumed

    @classmethod
    async def connect(cls, url: str, *, token: str | None = None, origin: str | None = None) -> Director:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        socket = await connect(url, additional_headers=headers, origin=None if origin is None else Origin(origin),
                               compression=None, max_size=None, open_timeout=30)
        return cls(socket)

    async def close(self) -> None:
        await self.socket.close()

    async def send(self, message: JsonMessage) -> None:
        await self.socket.send(json.dumps(message))

    async def receive(self) -> JsonMessage | AudioFrame:
        if self.pending:
            return self.pending.pop(0)
        async with asyncio.timeout(self.patience_s):
            data = await self.socket.recv()
        if isinstance(data, bytes):
            header, pcm = unpack_audio_frame(data)
            return AudioFrame(header, np.frombuffer(pcm, dtype="<i2").astype(np.int16), time.monotonic())
        message = json.loads(data)
        assert isinstance(message, dict)
        return message

    async def expect(self, kind: str) -> JsonMessage:
        """The next JSON message of this type; what arrives before it is kept for later calls."""
        skipped: list[JsonMessage | AudioFrame] = []
        try:
            while True:
                item = await self.receive()
                if isinstance(item, dict) and item["type"] == kind:
                    return item
                skipped.append(item)
        finally:
            self.pending = skipped + self.pending

    async def request(self, message: JsonMessage, reply: str) -> JsonMessage:
        await self.send(message)
        return await self.expect(reply)

    async def open(self, session_id: str | None = None, key: str | None = None) -> JsonMessage:
        """session.open; resuming sends `key`, or the key this process was given for the session."""
        message: JsonMessage = {"type": "session.open"}
        if session_id is not None:
            message["session_id"] = session_id
            key = key if key is not None else Director.keys.get(session_id)
            if key:
                message["session_key"] = key
        ready = await self.request(message, "session.ready")
        given = ready.get("session_key")
        if isinstance(given, str):
            Director.keys[str(ready["session_id"])] = given
        return ready

    @staticmethod
    def export_headers(session_id: str) -> dict[str, str]:
        """The headers that fetch a take's WAV export of this session (its key)."""
        return {"Retake-Session-Key": Director.keys.get(session_id, "")}

    async def start(self, line_id: str, text: str, **fields: object) -> TakeResult:
        """Send take.start; returns once take.queued (or an error) came back."""
        sent = time.monotonic()
        await self.send({"type": "take.start", "line_id": line_id, "text": text, **fields})
        skipped: list[JsonMessage | AudioFrame] = []  # e.g. a superseded take's audio and take.done
        while True:
            item = await self.receive()
            if isinstance(item, AudioFrame) or item["type"] not in ("take.queued", "error"):
                skipped.append(item)
                continue
            self.pending = skipped + self.pending
            take_id = item.get("take_id") if item["type"] == "take.queued" else 0
            result = TakeResult(take_id if isinstance(take_id, int) else 0, sent, time.monotonic())
            result.messages.append(item)
            return result

    async def finish(self, result: TakeResult) -> TakeResult:
        """Collect the take's messages and audio until its take.done."""
        keep: list[JsonMessage | AudioFrame] = []
        while not any(m["type"] == "take.done" for m in result.messages):
            item = await self.receive()
            if isinstance(item, AudioFrame):
                if item.header.take_id == result.take_id:
                    result.frames.append(item)
                    result.all_frames.append(item)
                else:
                    keep.append(item)
            elif item.get("take_id") == result.take_id and item["type"] != "error":
                result.messages.append(item)
                if item["type"] == "take.retry":
                    result.frames = []
            else:
                keep.append(item)
        self.pending = keep + self.pending
        return result

    async def take(self, line_id: str, text: str, **fields: object) -> TakeResult:
        result = await self.start(line_id, text, **fields)
        if result.take_id == 0:
            raise AssertionError(f"take refused: {result.messages[0]}")
        return await self.finish(result)

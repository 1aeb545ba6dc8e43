"""What both sockets (`/ws` directing, `/converse` conversation) share: admission, the outbox,
the close signal, the send loop, and the binary audio frame.

    if not await admit(websocket, settings): return          # accepts (backend/admission.py checked it)
    outbox = Outbox(dump, max_audio_frames)                   # filled by handlers and engine sinks
    outbox.message(m); outbox.audio(frame); outbox.close(code, reason)
    await send_loop(websocket, outbox)                        # raises Stop once the close is sent

Design choices:
- Only the send loop awaits the network: handlers and the engine thread's sinks (on the event
  loop) put into the socket's `Outbox` and return at once, so a slow client never stalls a
  handler, another socket, or the engine.
- The outbox is bounded by audio frames: audio goes in only while fewer than
  `max_audio_frames` wait, and `audio` says False past that, so the caller stops what makes
  the audio (a take, a conversation) rather than the server holding audio for a client that
  does not read. Control messages always go in (they are few and small), up to
  MAX_MESSAGES waiting: past that the client is flooding (pings) without reading, and the
  socket is dropped.
- A send that does not complete within `send_timeout_s` (the client stopped reading and its
  receive window is full) drops the socket too, so it cannot hold a session, a slot, or
  memory: the send loop raises Stop and the handler's cleanup runs.
- Closing is a message like the others (`Close`), so everything queued before it is sent
  first; after `close` the outbox takes nothing more. `Stop` ends a socket's tasks: the client
  left, or the server closed the socket.
- The outbox is typed by its protocol's server message: each protocol gives its `dump`, which
  makes a text frame (JSON on `/ws` and `/converse`) or a binary one (the Moshi protocol on
  `/api/chat`, where every message is a kind byte and its payload).
- Admission (host, origin, token) happens before any route runs, in backend/admission.py's
  middleware, so a refused socket is an HTTP error at the handshake, never an open socket;
  `admit` only accepts.
- Audio travels in binary frames with a 16-byte little-endian header (docs/protocol.md §5),
  the same on both sockets.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.websockets import WebSocket

from backend.settings import Settings

M = TypeVar("M")
MAX_MESSAGES = 1024  # control messages waiting for a client; past it the socket is dropped
log = logging.getLogger("retake.transport")


class Stop(Exception):
    """Ends a socket's tasks: the client left, or the server closed the socket."""


@dataclass(frozen=True)
class Close:
    code: int
    reason: str = ""


class Dropped(Stop):
    """The socket is dropped: its client stopped reading (the reason says how)."""


@dataclass(frozen=True)
class _Audio:
    """An audio frame in the outbox (counted against `max_audio_frames`, unlike messages)."""

    frame: bytes


class Outbox(Generic[M]):
    """What the send loop writes to the socket, in order."""

    def __init__(self, dump: Callable[[M], str | bytes], max_audio_frames: int) -> None:
        self.dump = dump
        self.items: collections.deque[str | bytes | _Audio | Close] = collections.deque()
        self.audio_frames = 0
        self.max_audio_frames = max_audio_frames
        self.ready = asyncio.Event()
        self.closed = False
        self.dropped: str | None = None  # why the socket is dropped (nothing more is sent)
        self.sender: asyncio.Task[None] | None = None  # the send loop, interrupted by `drop`

    def message(self, message: M) -> None:
        if self.closed:
            return
        if len(self.items) - self.audio_frames >= MAX_MESSAGES:
            self.drop(f"{MAX_MESSAGES} messages waited for a client that does not read")
            return
        self.items.append(self.dump(message))
        self.ready.set()

    def drop(self, reason: str) -> None:
        """Send nothing more: the send loop raises Dropped (the client is not reading)."""
        self.items.clear()
        self.audio_frames = 0
        self.closed = True
        self.dropped = reason
        self.ready.set()
        if self.sender is not None and self.sender is not asyncio.current_task():
            self.sender.cancel()  # it may be stuck in a send to this very client

    def audio(self, frame: bytes) -> bool:
        """Queue an audio frame; False if too many wait (the client is not reading)."""
        if self.closed:
            return True  # the socket is gone; what makes the audio is being stopped anyway
        if self.audio_frames >= self.max_audio_frames:
            return False
        self.items.append(_Audio(frame))
        self.audio_frames += 1
        self.ready.set()
        return True

    def close(self, code: int, reason: str = "") -> None:
        if not self.closed:
            self.items.append(Close(code, reason))
            self.closed = True
            self.ready.set()

    async def get(self) -> str | bytes | Close:
        while not self.items:
            if self.dropped is not None:
                raise Dropped(self.dropped)
            self.ready.clear()
            await self.ready.wait()
        item = self.items.popleft()
        if isinstance(item, _Audio):
            self.audio_frames -= 1
            return item.frame
        return item


async def send_loop(websocket: WebSocket, outbox: Outbox[M], send_timeout_s: float = 20.0) -> None:
    """Drain the outbox into the socket; at `Close`, close the socket and raise Stop. Raises
    Dropped when the outbox drops the socket or a send waits more than `send_timeout_s`."""
    outbox.sender = asyncio.current_task()
    try:
        while True:
            item = await outbox.get()
            async with asyncio.timeout(send_timeout_s):
                if isinstance(item, Close):
                    await websocket.close(item.code, item.reason)
                    raise Stop
                if isinstance(item, bytes):
                    await websocket.send_bytes(item)
                else:
                    await websocket.send_text(item)
    except TimeoutError:
        outbox.drop(f"a send waited {send_timeout_s:g} s for a client that does not read")
        log.info("dropped a socket: %s", outbox.dropped)
        raise Dropped(outbox.dropped) from None
    except Dropped:
        log.info("dropped a socket: %s", outbox.dropped)
        raise
    except asyncio.CancelledError:
        if outbox.dropped is None:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # cancelled by `drop`, not by its task group: end as Dropped
        log.info("dropped a socket: %s", outbox.dropped)
        raise Dropped(outbox.dropped) from None


# ─── Admission ────────────────────────────────────────────────────────────────


async def admit(websocket: WebSocket, settings: Settings) -> bool:
    """Accept the socket. Host, origin and token were checked before any route ran
    (backend/admission.py), so a refused one never gets here; True once accepted."""
    await websocket.accept()
    return True


# ─── Binary audio frames ──────────────────────────────────────────────────────

AUDIO_HEADER = struct.Struct("<BBHIII")  # kind, flags, reserved, take_id, seq, start_sample
KIND_PCM16 = 1
FLAG_LAST = 1


@dataclass(frozen=True)
class AudioHeader:
    kind: int
    flags: int
    take_id: int  # 0 on /converse
    seq: int  # 0, 1, ... per take attempt (per tick on /converse)
    start_sample: int  # of the window's first sample, from the start of the take attempt

    @property
    def last(self) -> bool:
        return bool(self.flags & FLAG_LAST)


def pack_audio_frame(take_id: int, seq: int, start_sample: int, pcm: bytes, *, last: bool) -> bytes:
    """Header + PCM16 little-endian mono samples."""
    return AUDIO_HEADER.pack(KIND_PCM16, FLAG_LAST if last else 0, 0, take_id, seq, start_sample) + pcm


def unpack_audio_frame(frame: bytes) -> tuple[AudioHeader, bytes]:
    if len(frame) < AUDIO_HEADER.size or (len(frame) - AUDIO_HEADER.size) % 2:
        raise ValueError(f"an audio frame is a {AUDIO_HEADER.size}-byte header and whole PCM16 samples; "
                         f"got {len(frame)} bytes")
    kind, flags, _reserved, take_id, seq, start_sample = AUDIO_HEADER.unpack_from(frame)
    return AudioHeader(kind, flags, take_id, seq, start_sample), frame[AUDIO_HEADER.size:]

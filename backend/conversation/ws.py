"""The `/converse` endpoint: a live, full-duplex conversation with PersonaPlex (docs/protocol.md §9).

Design choices:
- Admission as on `/ws` (backend/transport.py: origin, token), then `converse.open` until one
  succeeds (a `ping` meanwhile gets its `pong`: a client may keep the socket alive while it
  reads a clip): a bad persona or an unknown voice is an `error` and the client may try again; a
  server with every slot in use answers `busy` and closes with 1013. Until `converse.ready`
  is sent the handler writes to the socket itself, so `converse.ready` always comes before
  what the engine thread has already put in the outbox (`converse.listening`).
- Then two tasks under one TaskGroup: `receive` hands the user's binary audio to the
  conversation loop and answers `ping`; the transport's send loop drains the outbox that the
  engine thread fills (through `SocketSink`'s callbacks on the event loop). Whatever ends
  either task frees the slot.
- The outbox is bounded by agent frames (`MAX_AUDIO_FRAMES`): a client that stops reading is
  closed with 1008 rather than the server holding its audio.
"""

from __future__ import annotations

import asyncio

import numpy as np
from starlette import status
from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.clips import checked_clip
from backend.conversation import protocol as cp
from backend.conversation.loop import Conversation, ConversationLoop, NoFreeSlot, TooFast
from backend.settings import Settings
from backend.state import ServerState
from backend.transport import Outbox, Stop, admit, pack_audio_frame, send_loop
from engine import pcm16
from engine.errors import RequestError
from engine.personaplex import DEFAULT_PERSONA
from engine.personaplex.engine import MAX_CLIP_SECONDS

MAX_AUDIO_FRAMES = 1000  # agent frames waiting for a client that does not read (80 s of audio)


class SocketSink:
    """The engine thread's callbacks (run on the event loop): messages into the socket's outbox."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self.outbox: Outbox[cp.ServerMessage] = Outbox(cp.dump, MAX_AUDIO_FRAMES)

    def listening(self) -> None:
        self.outbox.message(cp.ConversationListening())

    def frame(self, tick: int, pcm: np.ndarray, text: str | None) -> None:
        samples = pcm16(pcm).astype("<i2").tobytes()  # [frame_samples]
        if not self.outbox.audio(pack_audio_frame(0, tick, tick * self.frame_samples, samples, last=False)):
            self.outbox.close(status.WS_1008_POLICY_VIOLATION, "the client is not reading")
        if text is not None:
            self.outbox.message(cp.ConversationText(tick, text))

    def failed(self, message: str) -> None:
        self.outbox.message(cp.Error("internal", message))
        self.outbox.close(status.WS_1011_INTERNAL_ERROR)


async def conversation_socket(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.retake
    if not await admit(websocket, state.settings):
        return
    conversations = state.conversations
    if conversations is None:
        await websocket.send_text(cp.dump(cp.Error("converse_off", "this server runs no conversation engine; start "
                                                                   "it with retake serve --converse")))
        await websocket.close(status.WS_1008_POLICY_VIOLATION)
        return
    sink = SocketSink(conversations.frame_samples)
    try:
        talk = await open_conversation(websocket, conversations, sink, state.settings)
    except (WebSocketDisconnect, Stop, OSError, TimeoutError):  # OSError: uvicorn's ClientDisconnected on a send
        return
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(receive(websocket, conversations, talk, sink.outbox))
            tasks.create_task(send_loop(websocket, sink.outbox, state.settings.send_timeout_s))
    except* (Stop, WebSocketDisconnect, OSError):  # closed, or the client left (OSError: as above)
        pass
    finally:
        conversations.leave(talk)


async def open_conversation(websocket: WebSocket, conversations: ConversationLoop, sink: SocketSink,
                            settings: Settings) -> Conversation:
    """Take a slot with the first good `converse.open` (within `open_timeout_s`); answer
    `converse.ready`. Sends here wait at most `send_timeout_s` (TimeoutError: the client does not read)."""
    opened_by = asyncio.get_running_loop().time() + settings.open_timeout_s

    async def send(message: cp.ServerMessage) -> None:
        async with asyncio.timeout(settings.send_timeout_s):
            await websocket.send_text(cp.dump(message))

    while True:
        try:
            async with asyncio.timeout_at(opened_by):  # only the wait for a message: a join is never cut
                frame = await websocket.receive()
        except TimeoutError:
            await send(cp.Error("bad_field", f"no converse.open within {settings.open_timeout_s:g} s of "
                                             "connecting; the socket is closed"))
            await websocket.close(status.WS_1008_POLICY_VIOLATION)
            raise Stop from None
        if frame["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(frame.get("code", 1000))
        try:
            text = frame.get("text")
            if text is None:
                raise cp.ConversationError("bad_field", "send converse.open (a text frame) before any audio")
            message = cp.parse_client_message(text)
            if isinstance(message, cp.Ping):  # a keepalive while the client gets its clip ready
                await send(cp.Pong())
                continue
            if not isinstance(message, cp.ConversationOpen):
                raise cp.ConversationError("bad_field", 'the first message must be {"type": "converse.open"}')
            clip = None
            if message.voice_clip is not None:  # checked off the loop before the engine decodes it
                clip, _seconds = await checked_clip(message.voice_clip, MAX_CLIP_SECONDS, "the clip")
            talk = await conversations.join(message.persona, message.voice, message.seed, sink, clip)
        except cp.ConversationError as error:  # before ready, every refusal is bad_field: open again
            await send(cp.Error("bad_field", error.message))
            continue
        except RequestError as error:
            await send(cp.Error("bad_field", str(error)))
            continue
        except NoFreeSlot as error:
            await send(cp.Error("busy", str(error)))
            await websocket.close(status.WS_1013_TRY_AGAIN_LATER)
            raise Stop from None
        engine = conversations.engine
        assert engine is not None
        try:
            await send(cp.ConversationReady(
                sample_rate=engine.sample_rate, frame_samples=engine.frame_size, voice=talk.voice,
                voices=conversations.voices, persona=DEFAULT_PERSONA if message.persona is None else message.persona,
                demo_weights=bool(engine.demo_weights)))
        except BaseException:  # the client left while its slot started: free it
            conversations.leave(talk)
            raise
        return talk


async def receive(websocket: WebSocket, conversations: ConversationLoop, talk: Conversation,
                  outbox: Outbox[cp.ServerMessage]) -> None:
    while True:
        frame = await websocket.receive()
        if frame["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(frame.get("code", 1000))
        data = frame.get("bytes")
        if data is not None:
            try:
                conversations.feed(talk, data)
            except RequestError as error:
                outbox.message(cp.Error("bad_field", str(error)))
            except TooFast as error:
                outbox.message(cp.Error("too_fast", str(error)))
                outbox.close(status.WS_1008_POLICY_VIOLATION, "too fast")
            continue
        try:
            message = cp.parse_client_message(frame.get("text") or "")
        except cp.ConversationError as error:
            outbox.message(cp.Error(error.code, error.message))
            continue
        match message:
            case cp.Ping():
                outbox.message(cp.Pong())
            case cp.ConversationOpen():
                outbox.message(cp.Error("unknown_type", "this conversation is open already; it takes ping and "
                                                        "audio"))

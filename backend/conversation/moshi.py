"""The Moshi protocol on `/api/chat`: the official PersonaPlex and moshi clients talk to the
conversation loop unchanged (docs/protocol.md §10).

    ws://HOST:PORT/api/chat?text_prompt=You+enjoy+a+good+talk.&voice_prompt=NATF2.pt&seed=42

Every message, both ways, is a binary frame: a kind byte, then its payload.

| kind | name | payload | who sends it |
|---|---|---|---|
| 0 | handshake | none | the server, once the system prompt is done: from now on the agent listens |
| 1 | audio | Ogg Opus pages, mono, 24 kHz | both |
| 2 | text | UTF-8, one piece of the agent's text | the server |
| 5 | error | UTF-8, what went wrong | the server, just before it closes the socket |

Design choices:
- The protocol is NVIDIA PersonaPlex's server (`moshi/server.py` of github.com/NVIDIA/personaplex,
  itself Kyutai's moshi server with a system prompt): the query parameters `text_prompt`
  (the persona; empty: none), `voice_prompt` (a voice of the checkpoint, `NATF2.pt` or
  `NATF2`; empty or missing: the default) and `seed` (-1: none); the handshake after the
  system prompt; audio as Ogg Opus pages through `sphn`, the library both servers and the
  moshi command-line client use; one text message per text token that is not padding. Kinds
  3 (control), 4 (metadata) and 6 (ping), which the clients' message types know, and the web
  client's sampling parameters (`text_temperature`, `audio_topk`, `text_seed`, ...) are
  accepted and ignored, as PersonaPlex's server does; kind 5 (error, in the clients' types)
  carries our refusals, where PersonaPlex's server would fail the handshake with a traceback.
- Underneath, the same conversation loop as `/converse` (backend/conversation/loop.py):
  the same slots, ticks, persona and voice checks. Only the edges differ: the user's Opus is
  decoded to float samples (`feed_samples`), and each tick's agent audio is Opus-encoded
  (sphn writes an Ogg page per tick, often more than one Opus packet) on the event loop.
- Refusals before the handshake (a bad query parameter, an unknown voice, a persona that
  does not fit, every slot busy, a server without `--converse`) are an error message and a
  close: 1008, or 1013 when busy. Audio that is not Ogg Opus breaks the stream for good: an
  error and 1008.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
from starlette import status
from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.conversation.loop import Conversation, ConversationLoop, NoFreeSlot, TooFast
from backend.conversation.protocol import MAX_PERSONA_CHARS
from backend.state import ServerState
from backend.transport import Outbox, Stop, admit, send_loop
from engine.errors import RequestError

HANDSHAKE, AUDIO, TEXT, CONTROL, METADATA, ERROR, PING = range(7)  # the kind byte
MAX_AUDIO_FRAMES = 1000  # agent ticks waiting for a client that does not read (80 s of audio)


def message(kind: int, payload: bytes = b"") -> bytes:
    return bytes([kind]) + payload


def error(text: str) -> bytes:
    return message(ERROR, text.encode())


def parse_query(query: Mapping[str, str]) -> tuple[str | None, str | None, int | None]:
    """persona, voice and seed from PersonaPlex's query parameters (RequestError says what to change)."""
    persona = query.get("text_prompt")  # missing: the default persona; empty: none, as PersonaPlex
    if persona is not None and len(persona) > MAX_PERSONA_CHARS:
        raise RequestError(f"text_prompt must be at most {MAX_PERSONA_CHARS} characters")
    voice = query.get("voice_prompt") or None  # PersonaPlex's names are file names: NATF2.pt
    if voice is not None and voice.endswith(".pt"):
        voice = voice[:-3]
    seed: int | None = None
    if (given := query.get("seed")) is not None:
        try:
            seed = int(given)
        except ValueError:
            raise RequestError(f"seed must be an integer (-1 for none); got {given!r}") from None
        if seed == -1:
            seed = None
        elif not 0 <= seed < 2**63:
            raise RequestError(f"seed must be -1 or in 0..2^63-1; got {seed}")
    return persona, voice, seed


class MoshiSink:
    """The engine thread's callbacks (run on the event loop): Moshi messages into the outbox."""

    def __init__(self, sample_rate: int) -> None:
        import sphn  # Opus in Ogg: only for this protocol, so a server runs without it

        self.writer = sphn.OpusStreamWriter(sample_rate)
        self.outbox: Outbox[bytes] = Outbox(lambda data: data, MAX_AUDIO_FRAMES)

    def listening(self) -> None:
        self.outbox.message(message(HANDSHAKE))

    def frame(self, tick: int, pcm: np.ndarray, text: str | None) -> None:
        opus = self.writer.append_pcm(np.asarray(pcm, dtype=np.float32))  # [frame_samples] -> Ogg pages
        if opus and not self.outbox.audio(message(AUDIO, opus)):
            self.outbox.close(status.WS_1008_POLICY_VIOLATION, "the client is not reading")
        if text:
            self.outbox.message(message(TEXT, text.encode()))

    def failed(self, text: str) -> None:
        self.outbox.message(error(text))
        self.outbox.close(status.WS_1011_INTERNAL_ERROR)


async def refuse(websocket: WebSocket, text: str, code: int) -> None:
    await websocket.send_bytes(error(text))
    await websocket.close(code)


async def moshi_socket(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.retake
    if not await admit(websocket, state.settings):
        return
    conversations = state.conversations
    try:
        if conversations is None:
            await refuse(websocket, "this server runs no conversation engine; start it with retake serve --converse",
                         status.WS_1008_POLICY_VIOLATION)
            return
        sink = MoshiSink(conversations.sample_rate)
        try:
            persona, voice, seed = parse_query(websocket.query_params)
            talk = await conversations.join(persona, voice, seed, sink)
        except RequestError as exc:
            await refuse(websocket, str(exc), status.WS_1008_POLICY_VIOLATION)
            return
        except NoFreeSlot as exc:
            await refuse(websocket, str(exc), status.WS_1013_TRY_AGAIN_LATER)
            return
    except (WebSocketDisconnect, OSError):  # the client left (OSError: uvicorn's ClientDisconnected on a send)
        return
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(receive(websocket, conversations, talk, sink.outbox))
            tasks.create_task(send_loop(websocket, sink.outbox, state.settings.send_timeout_s))
    except* (Stop, WebSocketDisconnect, OSError):  # closed, or the client left
        pass
    finally:
        conversations.leave(talk)


async def receive(websocket: WebSocket, conversations: ConversationLoop, talk: Conversation,
                  outbox: Outbox[bytes]) -> None:
    import sphn

    reader = sphn.OpusStreamReader(conversations.sample_rate)
    while True:
        frame = await websocket.receive()
        if frame["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(frame.get("code", 1000))
        data = frame.get("bytes")
        if data is None:
            outbox.message(error("send binary messages: a kind byte, then its payload (1: Ogg Opus audio)"))
            continue
        if not data or data[0] != AUDIO:
            continue  # empty, or a kind the server takes no action on (control, metadata, ping, ...)
        try:
            pcm = reader.append_bytes(data[1:])  # float32 [N], N >= 0
        except ValueError as exc:  # the Ogg stream is broken for good
            outbox.message(error(f"audio must be Opus in Ogg pages (as sphn or opus-recorder write it): {exc}"))
            outbox.close(status.WS_1008_POLICY_VIOLATION, "bad audio")
            continue
        if pcm.size:
            try:
                conversations.feed_samples(talk, pcm)
            except TooFast as exc:
                outbox.message(error(str(exc)))
                outbox.close(status.WS_1008_POLICY_VIOLATION, "too fast")

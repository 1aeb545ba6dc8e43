"""The Moshi protocol on /api/chat, spoken by moshi's own client code (moshi 0.2.13's `moshi.client`:
its `Connection` with its sphn Opus writer and reader and its message kinds, and its `run`, the
command-line entry), against a real server with the tiny PersonaPlex checkpoint. Only the sound
card is the test's: `sounddevice` is replaced by streams whose callbacks the test calls, as the
card would."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import numpy as np
import pytest
import sphn
from live_server import LiveServer, run

from backend.app import start_conversation_loop
from backend.conversation.loop import ConversationLoop
from backend.settings import Settings
from backend.tools.conversation_load import user_voice
from engine.personaplex.engine import PersonaPlex

SLOTS = 2
FRAME = 1920
PERSONA = "You enjoy having a good conversation."


class SoundCardStream:
    """sounddevice.InputStream / OutputStream without a card: the test calls `callback` itself."""

    opened: ClassVar[list[SoundCardStream]] = []

    def __init__(self, samplerate: float, channels: int, blocksize: int, callback: Any) -> None:
        self.blocksize, self.channels, self.callback = blocksize, channels, callback

    def __enter__(self) -> SoundCardStream:
        SoundCardStream.opened.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        SoundCardStream.opened.remove(self)


@pytest.fixture(scope="module")
def moshi_client() -> types.ModuleType:
    card = types.ModuleType("sounddevice")
    card.InputStream = card.OutputStream = SoundCardStream  # type: ignore[attr-defined]
    real = sys.modules.get("sounddevice")
    sys.modules["sounddevice"] = card
    try:
        sys.modules.pop("moshi.client", None)
        return importlib.import_module("moshi.client")
    finally:
        if real is None:
            del sys.modules["sounddevice"]
        else:
            sys.modules["sounddevice"] = real


class Printer:
    """moshi's RawPrinter interface (its terminal output), kept for the test."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.logs: list[tuple[str, str]] = []
        self.handshake = asyncio.Event()

    def print_header(self) -> None:
        pass

    def print_token(self, token: str) -> None:
        self.tokens.append(token)

    def log(self, level: str, msg: str) -> None:
        self.logs.append((level, msg))
        if msg == "unknown message kind 0":  # moshi's client takes no action on the handshake
            self.handshake.set()

    def print_lag(self) -> None:
        pass

    def print_pending(self) -> None:
        pass


@pytest.fixture(scope="module")
def conversations(personaplex_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[ConversationLoop]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("unused"), device="cpu", conversation=personaplex_checkpoint,
                        conversation_slots=SLOTS)
    loop = start_conversation_loop(settings)
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def talk_server(make_server: Any, conversations: ConversationLoop) -> LiveServer:
    return make_server(conversations=conversations)


def chat_url(server: LiveServer, **query: str) -> str:
    return f"{server.http.replace('http', 'ws')}/api/chat" + ("?" + "&".join(f"{k}={v}" for k, v in query.items())
                                                               if query else "")


def opus_round_trip(frames: list[np.ndarray]) -> np.ndarray:
    """What one side hears of float32 frames the other side's sphn writer sent: float32 [N]."""
    writer, reader = sphn.OpusStreamWriter(24000), sphn.OpusStreamReader(24000)
    return np.concatenate([reader.append_bytes(writer.append_pcm(frame)) for frame in frames])


def offline(checkpoint: Path, heard: np.ndarray, persona: str, voice: str, seed: int) -> tuple[np.ndarray, str]:
    """The agent's audio (as the client decodes it) and text for the user audio the server heard, by a fresh
    engine of as many slots, the other slot idle."""
    engine = PersonaPlex.load(checkpoint, device="cpu", slots=SLOTS)
    engine.set_sampling(engine.sampling.__class__(seed=seed))
    engine.start(0, persona, engine.voice(voice))
    silence = np.zeros((SLOTS, FRAME), dtype=np.float32)
    while engine.prefilling(0):
        engine.step(silence, set())  # the prompt read, nobody moved (as the server does)
    agent, text = [], ""
    for k in range(len(heard) // FRAME):
        batch = silence.copy()
        batch[0] = heard[FRAME * k: FRAME * (k + 1)]
        out = engine.step(batch)[0]
        assert out is not None
        agent.append(out.pcm)
        text += out.text or ""
    return opus_round_trip(agent), text


def test_moshis_client_converses_as_the_engine_does_offline(talk_server: LiveServer, moshi_client: Any,
                                                            personaplex_checkpoint: Path) -> None:
    """Handshake after the system prompt, audio both ways as Ogg Opus, text tokens, and the query
    parameters (persona, voice, seed) as PersonaPlex's web client sends them."""
    user = [user_voice(2.0, 24000, 3)[FRAME * k: FRAME * (k + 1)].astype(np.float32) / 32768 for k in range(25)]
    heard = opus_round_trip(user)  # what the server decodes of the client's pages
    ticks = len(heard) // FRAME
    expected_audio, expected_text = offline(personaplex_checkpoint, heard, PERSONA, "NATF2", seed=7)

    async def main() -> tuple[list[np.ndarray], Printer]:
        url = chat_url(talk_server, text_prompt=PERSONA.replace(" ", "+"), voice_prompt="NATF2.pt", seed="7",
                       text_temperature="0.7", audio_topk="250")  # the web client's sampling: ignored
        printer = Printer()
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as websocket:
            connection = moshi_client.Connection(printer, websocket, asyncio.get_running_loop())
            talking = asyncio.create_task(connection.run())
            await asyncio.wait_for(printer.handshake.wait(), 60)
            microphone, speaker = SoundCardStream.opened
            for frame in user:  # the card's callbacks, one block each, as fast as the test can
                microphone.callback(frame[:, None], FRAME, None, None)
            played = []
            for _ in range(ticks):
                for _ in range(3000):
                    if not connection._output_queue.empty():
                        break
                    await asyncio.sleep(0.02)
                block = np.zeros((FRAME, 1), dtype=np.float32)
                speaker.callback(block, FRAME, None, None)
                played.append(block[:, 0])
            for _ in range(500):  # the last tick's text comes after its audio
                if len("".join(printer.tokens)) >= len(expected_text):
                    break
                await asyncio.sleep(0.02)
            await websocket.close()
            await talking
        return played, printer

    played, printer = run(main())
    assert ticks == 25
    np.testing.assert_array_equal(np.concatenate(played), expected_audio[:ticks * FRAME])
    assert "".join(printer.tokens) == expected_text and expected_text  # the tiny agent says random pieces
    assert not [entry for entry in printer.logs if entry[0] == "error"]


def test_moshis_command_line_client_connects_with_just_the_url(talk_server: LiveServer, moshi_client: Any,
                                                               conversations: ConversationLoop) -> None:
    """`python -m moshi.client --url http://HOST:PORT` (it sends no query: the default persona and voice)."""
    async def main() -> tuple[Printer, np.ndarray]:
        printer = Printer()
        args = argparse.Namespace(url=talk_server.http, host="localhost", port=8998, https=False)
        talking = asyncio.create_task(moshi_client.run(printer, args))
        await asyncio.wait_for(printer.handshake.wait(), 60)
        microphone, speaker = SoundCardStream.opened
        connection = speaker.callback.__self__
        for _ in range(5):
            microphone.callback(np.zeros((FRAME, 1), np.float32), FRAME, None, None)
        for _ in range(3000):
            if not connection._output_queue.empty():
                break
            await asyncio.sleep(0.02)
        block = np.full((FRAME, 1), np.nan, dtype=np.float32)
        speaker.callback(block, FRAME, None, None)
        talking.cancel()  # Ctrl-C
        with contextlib.suppress(asyncio.CancelledError):
            await talking
        return printer, block[:, 0]

    printer, played = run(main())
    assert ("info", f"Connecting to {chat_url(talk_server)}.") in printer.logs
    assert np.isfinite(played).all() and np.abs(played).max() > 0  # an agent frame, not the card's silence
    for _ in range(500):
        if conversations.active == 0:
            return
        time.sleep(0.02)
    raise AssertionError("the server kept the conversation's slot after the client left")


async def refused(url: str) -> tuple[bytes, int | None]:
    """The first message and the close code of a socket the server refuses."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as websocket:
        first = await websocket.receive(timeout=60)
        closing = await websocket.receive(timeout=60)
        assert closing.type == aiohttp.WSMsgType.CLOSE, closing
        return first.data, websocket.close_code


@pytest.mark.parametrize(("query", "says"), [
    ({"voice_prompt": "NOPE.pt"}, "unknown voice 'NOPE'; the voices are NATF2"),
    ({"voice_prompt": "..%2F..%2Fetc%2Fpasswd"}, "unknown voice '../../etc/passwd'; the voices are NATF2"),
    ({"seed": "soon"}, "seed must be an integer (-1 for none); got 'soon'"),
    ({"seed": "-5"}, "seed must be -1 or in 0..2^63-1; got -5"),
    ({"text_prompt": "x" * 4001}, "text_prompt must be at most 4000 characters"),
    ({"text_prompt": "word+" * 790}, "shorten the persona"),
])
def test_a_bad_query_is_an_error_message_then_1008(talk_server: LiveServer, query: dict[str, str],
                                                    says: str) -> None:
    first, code = run(refused(chat_url(talk_server, **query)))
    assert first[0] == 5 and says in first[1:].decode(), first
    assert code == 1008


async def handshaken(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    websocket = await session.ws_connect(url)
    message = await websocket.receive(timeout=60)
    assert message.type == aiohttp.WSMsgType.BINARY and message.data == b"\x00", message
    return websocket


async def next_error(websocket: aiohttp.ClientWebSocketResponse) -> bytes:
    """The next error message's text, past the agent's audio and text (it talks while others prompt)."""
    while True:
        message = await websocket.receive(timeout=60)
        assert message.type == aiohttp.WSMsgType.BINARY, message
        if message.data[0] == 5:
            return bytes(message.data[1:])


def test_busy_bad_audio_text_frames_and_close(talk_server: LiveServer, conversations: ConversationLoop) -> None:
    async def main() -> None:
        async with asyncio.timeout(240), aiohttp.ClientSession() as session:  # a stall fails where it stalls
            first, second = await asyncio.gather(  # together: alone, a system prompt ticks as fast as it can
                handshaken(session, chat_url(talk_server)),
                handshaken(session, chat_url(talk_server, seed="-1", voice_prompt="")))
            data, code = await refused(chat_url(talk_server))  # every slot talks
            assert (data[0], code) == (5, 1013) and b"slots are in use" in data

            await first.send_str("hello")  # a text frame: an error, and the conversation goes on
            assert b"send binary messages" in await next_error(first)
            await first.send_bytes(b"\x06")  # ping, control, metadata: nothing to do
            await first.send_bytes(b"\x03\x00")
            await first.send_bytes(b"")

            await second.send_bytes(b"\x01not an ogg page, not at all")
            await second.send_bytes(b"\x01more")
            assert b"audio must be Opus in Ogg pages" in await next_error(second)
            while (await second.receive(timeout=60)).type == aiohttp.WSMsgType.BINARY:
                pass  # the agent's last ticks, sent before the close
            assert second.close_code == 1008
            await first.close()  # the client closes: its slot is freed
        for _ in range(500):
            if conversations.active == 0:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the server kept a slot after its client left")

    run(main())


def test_a_server_without_conversations_says_so(server: LiveServer) -> None:
    first, code = run(refused(chat_url(server)))
    assert first == b"\x05this server runs no conversation engine; start it with retake serve --converse"
    assert code == 1008

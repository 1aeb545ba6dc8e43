"""OpenAI's speech API on a real server, through the official `openai` package (3.57): every
response format, complete and streamed, decodes to the take; streams arrive while the take is
still being made; SSE events parse; voices and refusals as OpenAI's clients see them."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from typing import Any

import numpy as np
import openai
import pytest
from audio_check import assert_like
from live_server import LiveServer

from backend.audio_formats import FORMATS

TAKE = {"max_new_tokens": 24, "seed": 21, "temperature": 0.8}  # Retake's own fields, beside OpenAI's
LINE = "Places, everyone."
FIRST_BYTES = {"mp3": (b"ID3",), "opus": (b"OggS",), "aac": (b"\xff\xf1", b"\xff\xf9"), "flac": (b"fLaC",),
               "wav": (b"RIFF",), "pcm": (b"",)}


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def retake_stream(server: LiveServer, body: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    """Retake's own `"stream": true`: the take's raw samples as they are made, and the headers."""
    request = urllib.request.Request(f"{server.http}/v1/audio/speech", data=json.dumps(
        {"input": LINE, "stream": True, **TAKE, **body}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return {k.lower(): v for k, v in response.headers.items()}, response.read()


@pytest.fixture(scope="module")
def take(server: LiveServer) -> np.ndarray:
    """The take's samples (int16 [N] at 44.1 kHz): the seeded take through Retake's own stream."""
    samples = np.frombuffer(retake_stream(server, {})[1], dtype="<i2")
    assert len(samples) == 24 * 2048
    return samples


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_decodes_to_the_take(client: openai.OpenAI, take: np.ndarray, name: str) -> None:
    response = client.audio.speech.create(model="tts-1", voice="default", input=LINE, response_format=name,
                                          extra_body=TAKE)
    assert response.response.headers["content-type"] == FORMATS[name].media_type
    assert_like(name, response.content, take, 44100)

    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", input=LINE, response_format=name, stream_format="audio",
            extra_body=TAKE) as streamed:
        assert streamed.headers["content-type"] == FORMATS[name].media_type
        data = b"".join(streamed.iter_bytes())
    assert_like(name, data, take, 44100)


def test_openais_default_format_is_mp3(client: openai.OpenAI, take: np.ndarray) -> None:
    response = client.audio.speech.create(model="gpt-4o-mini-tts", voice="default", input=LINE, extra_body=TAKE)
    assert response.response.headers["content-type"] == "audio/mpeg"
    assert_like("mp3", response.content, take, 44100)


def sse_events(lines: Any) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


@pytest.mark.parametrize("name", ["pcm", "opus", "mp3"])
def test_sse_deltas_carry_the_format_then_done_with_usage(client: openai.OpenAI, take: np.ndarray,
                                                           name: str) -> None:
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="default", input=LINE, response_format=name, stream_format="sse",
            extra_body=TAKE) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = sse_events(streamed.iter_lines())
    deltas, done = events[:-1], events[-1]
    assert len(deltas) > 1 and all(event["type"] == "speech.audio.delta" for event in deltas)
    assert_like(name, b"".join(base64.b64decode(event["audio"]) for event in deltas), take, 44100)
    assert done["type"] == "speech.audio.done" and done["finish_reason"] == "length"
    usage = done["usage"]
    assert usage["output_tokens"] == 24 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def takes_total(server: LiveServer, finish_reason: str) -> int:
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as response:
        text = response.read().decode()
    prefix = f'retake_takes_total{{finish_reason="{finish_reason}"}} '
    return sum(int(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize(("name", "stream_format"), [(name, "audio") for name in sorted(FORMATS)] + [("mp3", "sse")])
def test_the_first_chunk_comes_while_the_take_is_being_made(server: LiveServer, client: openai.OpenAI, name: str,
                                                            stream_format: Any) -> None:
    """A take of 3,000 frames (a minute of decoding here): its first chunk arrives, the client leaves, and the
    take ends `cancelled`, so it was still being made when its first bytes were out."""
    cancelled = takes_total(server, "cancelled")
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", input="A long speech that goes on.", response_format=name,
            stream_format=stream_format, extra_body={"max_new_tokens": 3000, "seed": 5}) as streamed:
        first = next(streamed.iter_bytes())
    if stream_format == "sse":
        first = base64.b64decode(json.loads(first.split(b"\n")[0][len(b"data: "):])["audio"])
    assert first.startswith(FIRST_BYTES[name]) and len(first) > 0
    for _ in range(400):  # a cancelled take ends at its next step
        if takes_total(server, "cancelled") > cancelled:
            break
        time.sleep(0.05)
    assert takes_total(server, "cancelled") == cancelled + 1


def test_retakes_own_stream_stays_raw_pcm(server: LiveServer, take: np.ndarray) -> None:
    headers, data = retake_stream(server, {})
    assert headers["content-type"] == "audio/pcm" and headers["x-sample-rate"] == "44100"
    np.testing.assert_array_equal(np.frombuffer(data, dtype="<i2"), take)
    # Asking for OpenAI's pcm by name gives OpenAI's rate, streamed too.
    headers, data = retake_stream(server, {"response_format": "pcm"})
    assert headers["x-sample-rate"] == "24000"
    assert_like("pcm", data, take, 44100)


def test_openais_pcm_is_24_khz(client: openai.OpenAI, take: np.ndarray) -> None:
    """What OpenAI's clients assume of `pcm` (the SDK's player opens the device at 24 kHz)."""
    response = client.audio.speech.create(model="tts-1", voice="default", input=LINE, response_format="pcm",
                                          extra_body=TAKE)
    assert response.response.headers["x-sample-rate"] == "24000"
    assert len(response.content) // 2 == pytest.approx(len(take) * 24000 / 44100, abs=2)
    assert_like("pcm", response.content, take, 44100)


def test_instructions_describe_the_default_voice(client: openai.OpenAI) -> None:
    """With the engine's voice, instructions become a described character: the prompt grows by them."""
    def input_tokens(**fields: Any) -> int:
        with client.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="default", input=LINE, response_format="pcm", stream_format="sse",
                extra_body=TAKE, **fields) as streamed:
            return int(sse_events(streamed.iter_lines())[-1]["usage"]["input_tokens"])

    assert input_tokens(instructions="Speak like a tired lighthouse keeper.") > input_tokens()


@pytest.mark.parametrize(("fields", "says"), [
    ({"voice": "alloy"}, "unknown voice 'alloy'; the voices are default"),
    ({"voice": "default", "speed": 1.25}, "speed must be 1.0"),
    ({"voice": "default", "response_format": "ogg"}, "response_format must be one of"),
])
def test_refusals_reach_openais_client_as_bad_requests(client: openai.OpenAI, fields: dict[str, Any],
                                                       says: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", input=LINE, extra_body=TAKE, **fields)
    assert caught.value.status_code == 400 and says in caught.value.message

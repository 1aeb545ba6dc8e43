"""POST /v1/audio/speech on a real server: a WAV, a raw PCM16 stream and SSE give the same take."""

from __future__ import annotations

import base64
import io
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from audio_check import assert_like
from live_server import LiveServer

BODY = {"input": "Places, everyone.", "max_new_tokens": 16, "seed": 21, "temperature": 0.8}


def post(server: LiveServer, body: object) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http}/v1/audio/speech", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def test_wav_raw_stream_and_sse_carry_the_same_audio(server: LiveServer) -> None:
    status, headers, wav = post(server, {**BODY, "response_format": "wav"})
    assert status == 200 and headers["content-type"] == "audio/wav"
    samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 44100 and len(samples) > 0 and len(samples) % 2048 == 0

    status, headers, raw = post(server, {**BODY, "stream": True})
    assert status == 200 and headers["content-type"] == "audio/pcm"
    assert (headers["x-sample-rate"], headers["x-channels"], headers["x-bit-depth"]) == ("44100", "1", "16")
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<i2"), samples)

    status, headers, sse = post(server, {**BODY, "stream": True, "stream_format": "sse"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(block[len("data: "):]) for block in sse.decode().split("\n\n") if block]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(event["type"] == "speech.audio.delta" for event in deltas)
    pcm = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    np.testing.assert_array_equal(np.frombuffer(pcm, dtype="<i2"), samples)
    assert done["type"] == "speech.audio.done" and done["finish_reason"] in ("stop", "length")
    usage = done["usage"]
    assert usage["output_tokens"] == len(samples) // 2048
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

    status, headers, pcm_body = post(server, {**BODY, "response_format": "pcm"})  # OpenAI's pcm: 24 kHz
    assert status == 200 and headers["content-type"] == "audio/pcm" and headers["x-sample-rate"] == "24000"
    assert_like("pcm", pcm_body, samples, 44100)


def test_envelope_with_character_and_history(server: LiveServer) -> None:
    status, _, first = post(server, {**BODY, "response_format": "wav"})
    assert status == 200
    envelope = "@@drama3-space@@" + json.dumps({"text": "Then light it.", "history": ["Places, everyone."],
                                                "voice_references": 0,
                                                "character": {"name": "Mara", "description": "a tired keeper"}})
    status, _, wav = post(server, {**BODY, "input": envelope, "response_format": "wav",
                                   "references": [{"data": base64.b64encode(first).decode(), "text": "x"}]})
    assert status == 200
    samples, _ = sf.read(io.BytesIO(wav), dtype="int16")
    assert len(samples) > 0


@pytest.mark.parametrize(("body", "says"), [
    (b"{not json", "JSON"),
    ([1, 2], "object"),
    ({"max_new_tokens": 4}, "input"),
    ({**BODY, "top_p": 0}, "top_p"),
    ({**BODY, "temperature": "hot"}, "temperature"),
    ({**BODY, "stream": "yes"}, "stream"),
    ({**BODY, "stream": True, "stream_format": "mp3"}, "stream_format"),
    ({**BODY, "response_format": "ogg"}, 'response_format must be one of "mp3", "opus", "aac", "flac", "wav", "pcm"'),
    ({**BODY, "stream": False, "stream_format": "sse"}, "stream is false but stream_format asks for a stream"),
    ({**BODY, "speed": 1.5}, "speed must be 1.0: Retake does not time-stretch a take (got 1.5)"),
    ({**BODY, "speed": 9}, "speed must be between 0.25 and 4.0"),
    ({**BODY, "voice": "alloy"}, "unknown voice 'alloy'; the voices are default"),
    ({**BODY, "voice": {"id": "voice_1234"}}, "unknown voice 'voice_1234'"),
    ({**BODY, "voice": 7}, "voice must be a voice's name or id"),
    ({**BODY, "instructions": "Whisper.", "references": [{"data": "UklGRg==", "text": "x"}]},
     "never both: the references are clips"),
    ({**BODY, "instructions": "One line.\nTwo lines."}, "instructions: character.description"),
    ({**BODY, "references": [{"data": "%%%", "text": "x"}]}, "base64"),
    ({**BODY, "references": [{"data": base64.b64encode(b"not audio").decode(), "text": "x"}]}, "WAV or FLAC"),
    ({**BODY, "input": "@@drama3-space@@{broken"}, "envelope"),
])
def test_bad_requests_get_400_with_a_json_error(server: LiveServer, body: Any, says: str) -> None:
    status, headers, reply = post(server, body)
    assert status == 400 and headers["content-type"] == "application/json"
    error = json.loads(reply)["error"]
    assert error["type"] == "invalid_request_error" and says in error["message"]


def takes_total(server: LiveServer, finish_reason: str) -> int:
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as response:
        text = response.read().decode()
    prefix = f'retake_takes_total{{finish_reason="{finish_reason}"}} '
    return sum(int(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_take(server: LiveServer, stream: bool) -> None:
    """Leaving before the response (complete) or mid-stream stops the take at its next step."""
    cancelled = takes_total(server, "cancelled")
    body = json.dumps({"input": "A long speech that goes on.", "max_new_tokens": 3000, "seed": 11,
                       "stream": stream}).encode()
    host, port = server.http.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if stream:
            assert client.recv(4096).startswith(b"HTTP/1.1 200")  # the first audio is out
        else:
            time.sleep(0.5)  # the take is running; nothing has been answered yet
    for _ in range(400):  # 3,000 frames would take a minute; a cancelled take ends at its next step
        if takes_total(server, "cancelled") > cancelled:
            break
        time.sleep(0.05)
    assert takes_total(server, "cancelled") == cancelled + 1

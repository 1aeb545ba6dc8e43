"""Clips from clients (backend/clips.py): a decompression bomb is refused from its header before
anything decodes it, on every path a clip comes in (/ws voice.set, /v1/audio/speech, /converse);
a clip that passes gives the engine the same codes as the original file; text and clip sizes are
refused before they are read."""

from __future__ import annotations

import base64
import io
import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import websockets
from live_server import LiveServer, run
from raw_http import request

from backend.clips import clean_clip
from backend.directing.loop import EngineLoop
from backend.tools.client import Director
from engine.errors import RequestError

JSON = {"Content-Type": "application/json"}


def flac(seconds: float, rate: int, channels: int) -> bytes:
    """Silence, which FLAC packs to almost nothing: a small file that decodes to a lot."""
    out = io.BytesIO()
    with sf.SoundFile(out, "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        block = np.zeros((rate * 10, channels), dtype=np.int16)
        for _ in range(int(seconds // 10)):
            f.write(block)
    return out.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """2 minutes of 8 channels at 192 kHz (737 MB as float32 samples) in a few hundred KB."""
    data = flac(120, 192_000, 8)
    assert len(data) < 400_000
    return data


def test_a_bomb_is_refused_from_its_header_without_decoding(bomb: bytes) -> None:
    tracemalloc.start()
    with pytest.raises(RequestError, match=r"^clip is 120\.0 s long; the limit is 60 s"):
        clean_clip(bomb, 60, "clip")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 2**20, peak


def test_a_header_without_a_length_is_refused() -> None:
    """FLAC may leave its total length out (0): the length is then unknown until decoded."""
    data = bytearray(flac(120, 8000, 2))
    data[8 + 13] &= 0xF0  # STREAMINFO's 36-bit total sample count, after "fLaC" and the block header
    data[8 + 14: 8 + 18] = b"\0\0\0\0"
    with pytest.raises(RequestError, match="does not say in its header how long it is"):
        clean_clip(bytes(data), 60, "clip")


@pytest.mark.parametrize(("data", "says"), [
    (b"RIFF not a wav at all", "clip is not a WAV or FLAC file this server can read"),
    (b"", "clip is not a WAV or FLAC file this server can read"),
])
def test_what_is_not_audio_says_so_without_internals(data: bytes, says: str) -> None:
    with pytest.raises(RequestError) as refused:
        clean_clip(data, 60, "clip")
    assert str(refused.value).startswith(says) and "BytesIO" not in str(refused.value) and "0x" not in str(
        refused.value)


def test_a_clean_clip_encodes_to_the_same_codes_as_the_original(engine_loop: EngineLoop) -> None:
    """Stereo at 16 kHz: the clean clip is its mono mix at the same rate, as the engine would mix it."""
    rng = np.random.default_rng(4)
    stereo = (rng.standard_normal((16000, 2)) * 0.2).astype(np.float32)
    original = io.BytesIO()
    sf.write(original, stereo, 16000, format="FLAC", subtype="PCM_24")
    clean, seconds = clean_clip(original.getvalue(), 60, "clip")
    assert seconds == 1.0 and sf.info(io.BytesIO(clean)).channels == 1
    engine = engine_loop.engine
    assert engine is not None
    # On the test's thread while no take runs: encode_reference only reads the codec's weights.
    np.testing.assert_array_equal(np.asarray(engine.encode_reference(original.getvalue())),
                                  np.asarray(engine.encode_reference(clean)))


def test_every_path_refuses_a_bomb_before_the_engine_sees_it(server: LiveServer, talk_server: LiveServer,
                                                             bomb: bytes) -> None:
    encoded = base64.b64encode(bomb).decode()

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        error = await director.request({"type": "voice.set", "references": [{"audio": encoded, "text": "Hi."}]},
                                       "error")
        assert error["code"] == "bad_reference"
        assert str(error["message"]).startswith("references.0.audio is 120.0 s long; the limit is 60 s"), error
        error = await director.request({"type": "cast.set", "character_id": "mara", "name": "Mara",
                                        "voice": {"references": [{"audio": encoded, "text": "Hi."}]}}, "error")
        assert error["code"] == "bad_reference"
        assert str(error["message"]).startswith("voice.references.0.audio is 120.0 s long; the limit"), error
        await director.close()
        socket: Any = await websockets.connect(talk_server.converse, max_size=None)
        await socket.send(json.dumps({"type": "converse.open", "voice_clip": encoded}))
        reply = json.loads(await socket.recv())
        assert reply["code"] == "bad_field" and reply["message"].startswith("the clip is 120.0 s long; the limit "
                                                                            "is 30 s"), reply
        await socket.close()

    run(main())
    body = json.dumps({"input": "Hi.", "references": [{"data": encoded, "text": "Hi."}]}).encode()
    status, _, reply = request(server.http, "POST", "/v1/audio/speech", JSON, body)
    assert status == 400
    assert json.loads(reply)["error"]["message"].startswith("references.0.data is 120.0 s long"), reply
    # A saved voice, as JSON and as OpenAI's multipart upload.
    body = json.dumps({"name": "Bomb", "references": [{"audio": encoded, "text": "Hi."}]}).encode()
    status, _, reply = request(server.http, "POST", "/v1/audio/voices", JSON, body)
    assert status == 400 and json.loads(reply)["error"]["message"].startswith("clip 0 is 120.0 s long"), reply
    status, _, reply = request(server.http, "POST", "/v1/audio/voices", {"Content-Type": f"multipart/form-data; "
                                                                         f"boundary={BOUNDARY}"}, multipart(bomb))
    assert status == 400 and json.loads(reply)["error"]["message"].startswith("clip 0 is 120.0 s long"), reply
    assert request(server.http, "GET", "/v1/audio/voices")[2].count(b"Bomb") == 0


BOUNDARY = "retake-test-boundary"


def multipart(clip: bytes) -> bytes:
    """OpenAI's voice upload: name, audio_sample (a file) and its transcript."""
    parts = [b'Content-Disposition: form-data; name="name"\r\n\r\nBomb',
             b'Content-Disposition: form-data; name="audio_sample"; filename="a.flac"\r\n'
             b"Content-Type: audio/flac\r\n\r\n" + clip,
             b'Content-Disposition: form-data; name="transcript"\r\n\r\nHi.']
    boundary = f"--{BOUNDARY}".encode()
    return b"".join(boundary + b"\r\n" + part + b"\r\n" for part in parts) + boundary + b"--\r\n"


def test_sizes_are_refused_before_anything_reads_them(server: LiveServer) -> None:
    limits = server.settings.limits
    cases = [
        ({"input": "a" * 50_000}, f"input is 50000 characters; the limit is {limits.max_text_chars}"),
        ({"input": "@@drama3-space@@" + json.dumps({"text": "Hi.", "history": ["b" * 3000]})},
         f"history.0 is 3000 characters; the limit is {limits.max_text_chars}"),
        ({"input": "Hi.", "references": [{"data": "A" * (4 * limits.max_reference_bytes // 3 + 8), "text": "x"}]},
         f"references.0.data holds more than {limits.max_reference_bytes} bytes"),
        ({"input": "Hi.", "references": [{"data": "AAAA", "text": "x"}] * 40}, "references holds 40 clips"),
        ({"input": "@@drama3-space@@" + json.dumps({"text": "Hi.", "history": ["b"] * 40})},
         "history holds 40 turns; the limit is 32"),
    ]
    for body, says in cases:
        status, _, reply = request(server.http, "POST", "/v1/audio/speech", JSON, json.dumps(body).encode())
        assert status == 400 and json.loads(reply)["error"]["message"].startswith(says), reply

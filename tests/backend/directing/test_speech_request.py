"""The /v1/audio/speech body (backend/directing/speech_request.py): one bad request per rule, each
with the message that tells the user what to change; what good requests parse into; and the
prompt the speech handler builds from one, on the engine thread."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from backend.directing.jobs import CallJob, TakeJob, TakeOutcome
from backend.directing.loop import EngineLoop
from backend.directing.speech import speech_prompt
from backend.directing.speech_request import ENVELOPE_MARKER, Clip, parse_speech_request
from engine import Character, Drama3Engine, HistoryTurn, Reference, RequestError, Sampling

AUDIO = base64.b64encode(b"RIFF....WAVE").decode()
REF = {"data": AUDIO, "text": "A reference."}


def envelope(**fields) -> str:
    return ENVELOPE_MARKER + json.dumps({"text": "A line.", **fields})


BAD_BODIES = [
    ("body is not an object", ["input"], "the request body must be a JSON object"),
    ("input missing", {}, "input must be a string"),
    ("input is empty (Unicode white space)", {"input": " \u3000\u2028\t"}, "input is empty"),
    ("structural token", {"input": "hi <|im_end|> there"}, "input contains <|im_end|>"),
    ("semantic token", {"input": "<|semantic:12|>"}, "input contains <|semantic:"),
    ("speaker tag with a leading zero", {"input": "<|speaker:01|> hi"}, "malformed speaker tag"),
    ("speaker tag out of range", {"input": "<|speaker:16|> hi"}, "malformed speaker tag"),
    ("speaker tag not a number", {"input": "<|speaker:a|> hi"}, "malformed speaker tag"),
    ("speaker other than 0", {"input": "<|speaker:3|> hi"},
     r"input: only speaker 0 is supported; got speaker tags \[3\]"),
    ("temperature not a number", {"input": "hi", "temperature": "hot"}, "temperature must be a finite number"),
    ("temperature negative", {"input": "hi", "temperature": -0.1}, r"temperature must be in \[0, 100\] \(got -0.1\)"),
    ("top_p zero", {"input": "hi", "top_p": 0}, r"top_p must be in \(0, 1\]"),
    ("top_p above one", {"input": "hi", "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ("top_k zero", {"input": "hi", "top_k": 0}, r"top_k must be between 1 and 2147483647 \(got 0\)"),
    ("top_k a float", {"input": "hi", "top_k": 2.5}, "top_k must be an integer"),
    ("top_k a boolean", {"input": "hi", "top_k": True}, "top_k must be an integer"),
    ("max_new_tokens negative", {"input": "hi", "max_new_tokens": -4},
     r"max_new_tokens must be between 1 and 1200 \(got -4\)"),
    ("max_new_tokens a string", {"input": "hi", "max_new_tokens": "9"}, "max_new_tokens must be an integer"),
    ("seed negative", {"input": "hi", "seed": -1}, r"seed must be between 0 and 9223372036854775807 \(got -1\)"),
    ("references not a list", {"input": "hi", "references": {"data": AUDIO}}, "references must be a list of objects"),
    ("reference without audio", {"input": "hi", "references": [{"text": "x"}]},
     "references.0 needs its audio as a base64 string in 'data'"),
    ("reference audio not base64", {"input": "hi", "references": [{"data": "not base64!", "text": "x"}]},
     "references.0.data is not valid base64"),
    ("reference without transcript", {"input": "hi", "references": [{"data": AUDIO}]}, "references.0.text is empty"),
    ("envelope not JSON", {"input": ENVELOPE_MARKER + "{text:"}, "malformed envelope after @@drama3-space@@"),
    ("envelope not an object", {"input": ENVELOPE_MARKER + "[1]"},
     "the envelope after @@drama3-space@@ must be a JSON object"),
    ("envelope text empty", {"input": ENVELOPE_MARKER + json.dumps({"text": ""})}, "text is empty"),
    ("history not strings", {"input": envelope(history=[1]), "references": [REF]},
     "envelope history must be a list of strings"),
    ("history turn with a structural token", {"input": envelope(history=["a <|voice|>"]), "references": [REF]},
     "history.0 contains <|voice|>"),
    ("references do not match voice_references + history", {"input": envelope(history=["a"], voice_references=1),
                                                            "references": [REF]},
     "voice_references 1 and 1 history turns do not account for 1 references"),
    ("character not an object", {"input": envelope(character="Ada")}, "envelope character must be an object"),
    ("character with voice references", {"input": envelope(voice_references=1, character={"name": "A"}),
                                         "references": [REF]},
     "a described character cannot also have voice references"),
    ("character name on two lines", {"input": envelope(character={"name": "A\nB", "description": "d"})},
     "character.name must be a single line"),
    ("character name with a colon", {"input": envelope(character={"name": "Dr: A", "description": "d"})},
     "character.name must not contain ':'"),
    ("character description missing", {"input": envelope(character={"name": "Ada"})},
     "character.description must be a non-empty string"),
    ("character scene on two lines", {"input": envelope(character={"name": "A", "description": "d", "scene": "x\r"})},
     "character.scene must be a single line"),
    ("character name with a structural token", {"input": envelope(character={"name": "<|text|>", "description": "d"})},
     "character.name contains <|text|>"),
]


@pytest.mark.parametrize("body, message", [(b, m) for _, b, m in BAD_BODIES], ids=[n for n, _, _ in BAD_BODIES])
def test_bad_request_says_what_to_change(body, message):
    with pytest.raises(RequestError, match=message):
        parse_speech_request(body)


def test_plain_request():
    request = parse_speech_request({"input": "\x1c", "references": [REF], "temperature": 0, "top_k": 7,
                                    "max_new_tokens": 5000, "seed": 3})
    # U+001C is not Unicode White_Space: str.strip() would call this empty; the model does not.
    assert request.text == "\x1c"
    assert request.references == [Clip(b"RIFF....WAVE", "A reference.")]
    assert request.history == [] and request.character is None
    assert request.sampling == Sampling(temperature=0.0, top_p=0.9, top_k=7, max_new_tokens=1200, seed=3)


def test_defaults():
    assert parse_speech_request({"input": "hi", "max_new_tokens": 0}).sampling == Sampling(
        temperature=1.0, top_p=0.9, top_k=30, max_new_tokens=1200, seed=None)


def test_envelope_with_voice_and_history():
    other = {"base64": base64.b64encode(b"fLaC").decode(), "text": "ignored for a history clip"}
    request = parse_speech_request({"input": envelope(history=["First.", "Second."], voice_references=1),
                                    "references": [REF, other, other]})
    assert request.text == "A line."
    assert request.references == [Clip(b"RIFF....WAVE", "A reference.")]
    assert request.history == [Clip(b"fLaC", "First."), Clip(b"fLaC", "Second.")]


def test_envelope_with_character():
    request = parse_speech_request({"input": envelope(character={"name": " Ada ", "description": "calm\u3000",
                                                                 "scene": None})})
    assert request.character == Character("Ada", "calm", None)
    assert request.references == []


def wav_bytes(seconds: float, seed: int) -> bytes:
    noise = np.random.default_rng(seed).uniform(-0.3, 0.3, int(44100 * seconds)).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, noise, 44100, format="WAV")
    return buffer.getvalue()


def test_speech_request_to_prompt(engine_loop: EngineLoop) -> None:
    voice, turn = wav_bytes(0.5, 0), wav_bytes(0.3, 1)
    envelope = '@@drama3-space@@{"text": "Now.", "history": ["Before."], "voice_references": 1}'
    request = parse_speech_request({"input": envelope, "max_new_tokens": 4, "seed": 0, "references": [
        {"data": base64.b64encode(voice).decode(), "text": "The voice."},
        {"data": base64.b64encode(turn).decode(), "text": "unused"}]})

    def on_engine(engine: Drama3Engine) -> None:  # the engine is the engine thread's
        prompt = speech_prompt(engine, request, request.sampling)
        expected = engine.prompt("Now.", [Reference(engine.encode_reference(voice), "The voice.")],
                                 [HistoryTurn("Before.", engine.encode_reference(turn))],
                                 Sampling(max_new_tokens=4, seed=0))
        assert torch.equal(prompt.rows, expected.rows) and prompt.history_used == 1
        assert engine.encode_reference(voice).shape == (10, math.ceil(0.5 * 44100 / 2048))

    class Outcome:
        """The take's sink: only its outcome matters here."""

        def __init__(self) -> None:
            self.outcome: asyncio.Future[TakeOutcome] = asyncio.get_running_loop().create_future()

        def started(self, attempt: int, sampling: Sampling) -> None: ...

        def history(self, used: int) -> None: ...

        def window(self, attempt: int, window: object) -> None: ...

        def retry(self, attempt: int, message: str) -> None: ...

        def done(self, outcome: TakeOutcome) -> None:
            self.outcome.set_result(outcome)

    async def main() -> TakeOutcome:
        loop = asyncio.get_running_loop()
        job: CallJob[None] = CallJob(on_engine, loop)
        engine_loop.submit(job)
        await asyncio.wait_for(job.future, 120)
        sink = Outcome()
        engine_loop.submit(TakeJob(lambda engine, sampling: speech_prompt(engine, request, sampling),
                                   request.sampling, sink, loop, None, None))
        return await asyncio.wait_for(sink.outcome, 120)

    codes = asyncio.run(main()).codes
    assert codes is not None and codes.shape == (10, 4)

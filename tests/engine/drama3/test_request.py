"""The /v1/audio/speech body and the take inputs: one bad request per rule, each with the
message that tells the user what to change; and what good requests parse into."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from engine.drama3.config import Drama3Config, preset
from engine.drama3.prompt import Character, HistoryTurn, Reference, build_prompt
from engine.drama3.request import ENVELOPE_MARKER, Clip, parse_speech_request
from engine.drama3.sampling import Sampling
from engine.drama3.tokenizer import tiny_tokenizer, token_ids
from engine.errors import RequestError

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
    ("speaker other than 0", {"input": "<|speaker:3|> hi"}, r"input: only speaker 0 is supported; got speaker tags \[3\]"),
    ("temperature not a number", {"input": "hi", "temperature": "hot"}, "temperature must be a number"),
    ("temperature negative", {"input": "hi", "temperature": -0.1}, "temperature must be a non-negative number"),
    ("top_p zero", {"input": "hi", "top_p": 0}, r"top_p must be in \(0, 1\]"),
    ("top_p above one", {"input": "hi", "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ("top_k zero", {"input": "hi", "top_k": 0}, "top_k must be a positive integer"),
    ("top_k a float", {"input": "hi", "top_k": 2.5}, "top_k must be a positive integer"),
    ("top_k a boolean", {"input": "hi", "top_k": True}, "top_k must be a positive integer"),
    ("max_new_tokens negative", {"input": "hi", "max_new_tokens": -4}, "max_new_tokens must be a positive integer"),
    ("max_new_tokens a string", {"input": "hi", "max_new_tokens": "9"}, "max_new_tokens must be a positive integer"),
    ("seed negative", {"input": "hi", "seed": -1}, r"seed must be an integer in \[0, 2\*\*63\)"),
    ("references not a list", {"input": "hi", "references": {"data": AUDIO}}, "references must be a list of objects"),
    ("reference without audio", {"input": "hi", "references": [{"text": "x"}]},
     "references.0 needs its audio as a base64 string in 'data'"),
    ("reference audio not base64", {"input": "hi", "references": [{"data": "not base64!", "text": "x"}]},
     "references.0.data is not valid base64"),
    ("reference without transcript", {"input": "hi", "references": [{"data": AUDIO}]}, "references.0.text is empty"),
    ("envelope not JSON", {"input": ENVELOPE_MARKER + "{text:"}, "malformed envelope after @@drama3-space@@"),
    ("envelope not an object", {"input": ENVELOPE_MARKER + "[1]"}, "the envelope after @@drama3-space@@ must be a JSON object"),
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


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def config(tokenizer):
    return Drama3Config.from_dict(preset("tiny", **token_ids(tokenizer)))


CODES = torch.zeros((10, 3), dtype=torch.long)
BAD_TAKES = [
    ("reference codes wrong shape", dict(voice=[Reference(torch.zeros((9, 3), dtype=torch.long), "r")]),
     r"references.0 codes must be an integer \[10, frames\] array"),
    ("reference codes empty", dict(voice=[Reference(torch.zeros((10, 0), dtype=torch.long), "r")]),
     "with at least one frame"),
    ("reference codes float", dict(voice=[Reference(torch.zeros((10, 2)), "r")]), "must be an integer"),
    ("history codes out of range", dict(history=[HistoryTurn("t", torch.full((10, 2), 4096))]),
     r"history.0 codes must be in \[0, 4096\)"),
    ("history codes negative", dict(history=[HistoryTurn("t", torch.full((10, 2), -1))]),
     r"history.0 codes must be in \[0, 4096\)"),
    ("history text empty", dict(history=[HistoryTurn("", CODES)]), "history.0.text is empty"),
    ("reference transcript with speaker 2", dict(voice=[Reference(CODES, "<|speaker:2|>hi")]),
     "only speaker 0 is supported"),
    ("voice of the wrong kind", dict(voice="Ada"), "voice must be a list of references, a character, or none"),
    ("character name with a colon", dict(voice=Character("A:B", "d")), "character.name must not contain ':'"),
    ("prompt too long", dict(text="a" * 8200), "a prompt of 82.. rows exceeds the maximum allowed length of 8192 rows"),
    ("sampling out of range", dict(sampling=Sampling(top_p=0.0)), r"top_p must be in \(0, 1\]"),
]


@pytest.mark.parametrize("take, message", [(t, m) for _, t, m in BAD_TAKES], ids=[n for n, _, _ in BAD_TAKES])
def test_bad_take_says_what_to_change(take, message, tokenizer, config):
    take = {"text": "A line.", "voice": None, "history": [], "sampling": Sampling(), **take}
    with pytest.raises(RequestError, match=message):
        build_prompt(take["text"], take["voice"], take["history"], take["sampling"], tokenizer, config)


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

"""The take inputs the engine checks (`build_prompt`): one bad take per rule, each with the message
that tells the user what to change."""

from __future__ import annotations

import numpy as np
import pytest

from engine.drama3.config import Drama3Config, preset
from engine.drama3.prompt import Character, HistoryTurn, Reference, build_prompt
from engine.drama3.sampling import Sampling
from engine.drama3.tokenizer import tiny_tokenizer, token_ids
from engine.errors import RequestError


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def config(tokenizer):
    return Drama3Config.from_dict(preset("tiny", **token_ids(tokenizer)))


CODES = np.zeros((10, 3), dtype=np.int64)
BAD_TAKES = [
    ("reference codes wrong shape", dict(voice=[Reference(np.zeros((9, 3), dtype=np.int64), "r")]),
     r"references.0 codes must be an integer \[10, frames\] array"),
    ("reference codes empty", dict(voice=[Reference(np.zeros((10, 0), dtype=np.int64), "r")]),
     "with at least one frame"),
    ("reference codes float", dict(voice=[Reference(np.zeros((10, 2)), "r")]), "must be an integer"),
    ("history codes out of range", dict(history=[HistoryTurn("t", np.full((10, 2), 4096))]),
     r"history.0 codes must be in \[0, 4096\)"),
    ("history codes negative", dict(history=[HistoryTurn("t", np.full((10, 2), -1))]),
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

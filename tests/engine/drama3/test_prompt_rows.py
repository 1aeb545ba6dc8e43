"""An engine's cache of prompt parts laid out (prompt_rows.py): prompts built through it are
the prompts built without it, whatever changed between takes, and it stays within its rows."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest
import torch

from engine.drama3.config import Drama3Config, preset
from engine.drama3.prompt import Character, HistoryTurn, Reference, build_prompt, segment_rows
from engine.drama3.prompt_rows import PromptRows
from engine.drama3.sampling import Sampling
from engine.drama3.tokenizer import tiny_tokenizer, token_ids


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def config(tokenizer) -> Drama3Config:
    return Drama3Config.from_dict(preset("tiny", **token_ids(tokenizer)))


def codes_of(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, (10, frames), dtype=np.int64)


def test_prompts_through_the_cache_are_the_prompts_without_it(tokenizer, config) -> None:
    cache = PromptRows(functools.partial(segment_rows, tokenizer=tokenizer, config=config))
    history = [HistoryTurn(f"Line {i}.", codes_of(12, i)) for i in range(6)]
    edited = [*history[:2], HistoryTurn("Line 2, said again.", history[2].codes), *history[3:]]
    recoded = [*history[:4], HistoryTurn(history[4].text, codes_of(12, 99)), history[5]]
    cast = (Character("Ann", "calm"), Character("Bo", "loud"))
    ann = Character("Ann", "calm", scene="A kitchen.", cast=cast)
    spoken = [HistoryTurn(t.text, t.codes, speaker="Bo" if i % 2 else "Ann") for i, t in enumerate(history)]
    references = [Reference(codes_of(8, 7), "A reference.")]
    takes = [("Who left the lamp burning?", None, history), ("Who left the lamp burning?", None, history),
             ("The next line.", None, [*history, HistoryTurn("Who left it?", codes_of(9, 50))]),
             ("Who left the lamp burning?", None, edited), ("Who left the lamp burning?", None, recoded),
             ("Who left the lamp burning?", None, history[3:]), ("Who left the lamp burning?", references, history),
             ("Who left the lamp burning?", ann, spoken), ("Who left the lamp burning?", None, [])]
    for text, voice, turns in takes:
        fresh = build_prompt(text, voice, turns, Sampling(), tokenizer, config)
        cached = build_prompt(text, voice, turns, Sampling(), tokenizer, config, rows=cache.rows)
        assert torch.equal(cached.rows, fresh.rows) and cached.boundaries == fresh.boundaries
    assert cache.hits >= 6 * 3 and cache.misses > 0
    history[0].codes[0, 0] = (history[0].codes[0, 0] + 1) % 4096  # a turn's codes changed in place
    fresh = build_prompt("Who left the lamp burning?", None, history, Sampling(), tokenizer, config)
    cached = build_prompt("Who left the lamp burning?", None, history, Sampling(), tokenizer, config, rows=cache.rows)
    assert torch.equal(cached.rows, fresh.rows)


def test_the_cache_drops_its_least_recently_used_parts_past_its_rows(tokenizer, config) -> None:
    layouts = []

    def layout(segments):
        layouts.append(len(segments))
        return segment_rows(segments, tokenizer, config)

    cache = PromptRows(layout, max_rows=100)
    turns = [[f"Line {i}.", codes_of(20, i)] for i in range(8)]  # ~25 rows each
    for turn in turns[:3]:
        cache.rows(turn)
    cache.rows(turns[0])  # the first is now the most recently used
    for turn in turns[3:5]:
        cache.rows(turn)
    assert cache.held <= 100 and cache.held == sum(len(rows) for rows in cache.parts.values())
    before = len(layouts)
    cache.rows(turns[0])  # kept
    assert len(layouts) == before
    cache.rows(turns[1])  # dropped: laid out again
    assert len(layouts) == before + 1


def test_threads_building_prompts_at_once_get_their_own_rows(tokenizer, config) -> None:
    cache = PromptRows(functools.partial(segment_rows, tokenizer=tokenizer, config=config), max_rows=200)
    turns = [HistoryTurn(f"Line {i}.", codes_of(15, i)) for i in range(12)]
    expected = {n: build_prompt("A line.", None, turns[:n], Sampling(), tokenizer, config).rows for n in range(12)}
    failures: list[int] = []

    def build(seed: int) -> None:
        for step in range(60):
            n = (seed * 7 + step) % 12
            got = build_prompt("A line.", None, turns[:n], Sampling(), tokenizer, config, rows=cache.rows).rows
            if not torch.equal(got, expected[n]):
                failures.append(n)

    threads = [threading.Thread(target=build, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and cache.held <= 200

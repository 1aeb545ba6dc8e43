"""Prompt rows of every layout: against rows written out by hand on the tiny tokenizer,
and against sglang-omni 0.1.9's own builder for the layouts it has (stock, references);
an engine's cache of prompt parts laid out (prompt_rows.py): prompts built through it are
the prompts built without it, whatever changed between takes, and it stays within its rows."""

from __future__ import annotations

import functools
import re
import threading

import numpy as np
import pytest
import torch

from engine.drama3.config import Drama3Config, preset
from engine.drama3.prompt import Character, HistoryTurn, Reference, build_prompt, build_segments, segment_rows
from engine.drama3.prompt_rows import PromptRows
from engine.drama3.sampling import Sampling
from engine.drama3.tokenizer import tiny_tokenizer, token_ids
from engine.errors import RequestError

# The tiny tokenizer's special ids (tokenizer.py: 256 bytes, then the specials in order).
IM_START, IM_END, VOICE, AUDIO_SEPARATOR, SPEAKER_0, SEMANTIC_0 = 256, 257, 258, 261, 262, 278


def byte_ids(text: str) -> list[int]:
    """Ids of text's UTF-8 bytes in a byte-level BPE with no merges, worked out from
    GPT-2's byte-to-character table (printable bytes keep their character; the
    rest map to U+0100 onwards) sorted by character."""
    ids = []
    others = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    for b in text.encode():
        if 33 <= b <= 126:
            ids.append(b - 33)
        elif 161 <= b <= 172:
            ids.append(94 + b - 161)
        elif 174 <= b <= 255:
            ids.append(106 + b - 174)
        else:
            ids.append(188 + others.index(b))
    return ids


def text_rows(ids: list[int]) -> torch.Tensor:
    rows = torch.zeros((len(ids), 11), dtype=torch.long)
    rows[:, 0] = torch.tensor(ids)
    return rows


def code_rows(codes: np.ndarray) -> torch.Tensor:
    return torch.stack([torch.tensor([SEMANTIC_0 + int(c[0]), *map(int, c)]) for c in codes.T])


def expected(*parts: list[int] | torch.Tensor) -> torch.Tensor:
    return torch.cat([p if isinstance(p, torch.Tensor) else text_rows(p) for p in parts])


SYSTEM = [IM_START, *byte_ids("system\n")]
END = [IM_END, *byte_ids("\n")]
USER = [IM_START, *byte_ids("user\n")]
ASSISTANT = [IM_START, *byte_ids("assistant\n"), VOICE]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def config(tokenizer) -> Drama3Config:
    return Drama3Config.from_dict(preset("tiny", **token_ids(tokenizer)))


def codes_of(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, (10, frames), dtype=np.int64)


def rows_of(text, voice, history, tokenizer, config) -> torch.Tensor:
    return build_prompt(text, voice, history, Sampling(), tokenizer, config).rows


def test_byte_ids_agree_with_tokenizer_on_every_byte(tokenizer):
    # The hand table covers all 256 bytes (latin-1 chars are 1 or 2 UTF-8 bytes).
    sample = "".join(map(chr, range(1, 256)))
    assert tokenizer.encode(sample).ids == byte_ids(sample)


def test_stock_layout(tokenizer, config):
    rows = rows_of("Hi, é!", None, [], tokenizer, config)
    want = expected(SYSTEM, byte_ids("convert the provided text to speech"), END,
                    USER, [SPEAKER_0, *byte_ids(" Hi, é!")], END, ASSISTANT)
    assert torch.equal(rows, want)


def test_reference_layout_moves_leading_white_space_behind_the_tag(tokenizer, config):
    a, b = codes_of(3, 0), codes_of(2, 1)
    voice = [Reference(a, "first clip"), Reference(b, "\u3000 <|speaker:0|>second")]
    rows = rows_of("<|speaker:0|>Go.", voice, [], tokenizer, config)
    want = expected(SYSTEM, byte_ids("convert the provided text to speech reference to the following:"),
                    [*byte_ids("\n\n[Reference 1]\nText: "), SPEAKER_0, *byte_ids(" first clip\nSpeech: ")],
                    code_rows(a),
                    [*byte_ids("\n\n[Reference 2]\nText: "), SPEAKER_0, *byte_ids("\u3000 second\nSpeech: ")],
                    code_rows(b),
                    END, USER, [SPEAKER_0, *byte_ids("Go.")], END, ASSISTANT)
    assert torch.equal(rows, want)


def test_character_layout(tokenizer, config):
    character = Character(" Ada ", "a tired detective", "\tA rainy office. ")
    rows = rows_of("Sit down.", character, [], tokenizer, config)
    instruction = [*byte_ids("Voice every line of the script in order, with "), AUDIO_SEPARATOR,
                   *byte_ids(" between consecutive lines.")]
    want = expected(SYSTEM, [*byte_ids("Scene: A rainy office.\nCharacters:\n- Ada: a tired detective\n"),
                             *instruction], END,
                    USER, byte_ids("Ada: Sit down."), END, ASSISTANT)
    assert torch.equal(rows, want)
    no_scene = rows_of("Sit down.", Character("Ada", "a tired detective"), [], tokenizer, config)
    head = expected(SYSTEM, byte_ids("Characters:\n"))
    assert torch.equal(no_scene[: len(head)], head)


def test_history_in_stock_and_character_layouts(tokenizer, config):
    first, second = codes_of(4, 2), codes_of(1, 3)
    history = [HistoryTurn("One.", first), HistoryTurn("Two.", second)]
    rows = rows_of("Three.", None, history, tokenizer, config)
    want = expected(SYSTEM, byte_ids("convert the provided text to speech"), END,
                    USER, [SPEAKER_0, *byte_ids(" One.")], END, ASSISTANT, code_rows(first), END,
                    USER, [SPEAKER_0, *byte_ids(" Two.")], END, ASSISTANT, code_rows(second), END,
                    USER, [SPEAKER_0, *byte_ids(" Three.")], END, ASSISTANT)
    assert torch.equal(rows, want)

    character = Character("Bo", "a sailor")
    rows = rows_of("Three.", character, history[1:], tokenizer, config)
    head = segment_rows(build_segments("x", character, [])[:3], tokenizer, config)
    want = expected(head, USER, byte_ids("Bo: Two."), END, ASSISTANT, code_rows(second), END,
                    USER, byte_ids("Bo: Three."), END, ASSISTANT)
    assert torch.equal(rows, want)


def test_a_scene_of_described_characters(tokenizer, config):
    """The whole cast in the system (the same for each character's take), each turn said by its
    own speaker, the line by the take's character."""
    ada, bo = Character("Ada", "a tired detective", "A rainy office."), Character("Bo", "a sailor")
    cast = (ada, bo)
    first, second = codes_of(4, 2), codes_of(1, 3)
    history = [HistoryTurn("Who are you?", first, speaker="Ada"), HistoryTurn("A friend.", second, speaker="Bo")]
    rows = rows_of("Prove it.", Character("Ada", ada.description, ada.scene, cast), history, tokenizer, config)
    instruction = [*byte_ids("Voice every line of the script in order, with "), AUDIO_SEPARATOR,
                   *byte_ids(" between consecutive lines.")]
    system = expected(SYSTEM, [*byte_ids("Scene: A rainy office.\nCharacters:\n- Ada: a tired detective\n"
                                         "- Bo: a sailor\n"), *instruction], END)
    want = expected(system, USER, byte_ids("Ada: Who are you?"), END, ASSISTANT, code_rows(first), END,
                    USER, byte_ids("Bo: A friend."), END, ASSISTANT, code_rows(second), END,
                    USER, byte_ids("Ada: Prove it."), END, ASSISTANT)
    assert torch.equal(rows, want)
    # Bo's take of the next line starts with the same rows up to its own line.
    bo_rows = rows_of("Gladly.", Character("Bo", bo.description, ada.scene, cast), history, tokenizer, config)
    shared = len(want) - len(expected(USER, byte_ids("Ada: Prove it."), END, ASSISTANT))
    assert torch.equal(bo_rows[:shared], want[:shared])
    assert torch.equal(bo_rows[shared:], expected(USER, byte_ids("Bo: Gladly."), END, ASSISTANT))


    for voice, turns, says in [
        (Character("Ada", "x", None, (bo,)), [], "character.cast must hold the character itself ('Ada')"),
        (Character("Ada", "x", None, (ada, Character("C:3", "y"))), [], "character.cast.1.name must not contain ':'"),
        (ada, [HistoryTurn("Hi.", first, speaker="")], "history.0.speaker must be a non-empty string"),
    ]:
        with pytest.raises(RequestError, match=re.escape(says)):
            rows_of("Go.", voice, turns, tokenizer, config)


def test_every_literal_is_tokenised_on_its_own(tokenizer, config):
    # Joined, "...speech" + "<|im_end|>" would still split at the special token; the
    # point is the segment list: rows are the concatenation of per-segment rows.
    segments = build_segments("Hi.", [Reference(codes_of(2, 4), "ref")], [HistoryTurn("Earlier.", codes_of(3, 5))])
    rows = segment_rows(segments, tokenizer, config)
    per_segment = torch.cat([segment_rows([s], tokenizer, config) for s in segments])
    assert torch.equal(rows, per_segment)
    assert rows.dtype == torch.long and rows.shape[1] == 11


def test_matches_sglang_omni_builder(tokenizer, config):
    sglang_prompt = pytest.importorskip("sglang_omni.models.fishaudio_drama3.prompt")
    cases = [
        ("Hello there.", []),
        ("  <|speaker:0|> Tabs\tand\u2003spaces  ", []),
        ("Again.", [("one", codes_of(5, 6))]),
        ("Again.", [("\u2028<|speaker:0|>two", codes_of(1, 7)), ("  three ", codes_of(7, 8))]),
    ]
    for text, references in cases:
        ours = rows_of(text, [Reference(c, t) for t, c in references] or None, [], tokenizer, config)
        theirs = sglang_prompt.build_prompt_rows(
            text, [sglang_prompt.ReferencePart(transcript=t, audio_codes=torch.from_numpy(c)) for t, c in references],
            tokenizer, num_codebooks=10, codebook_size=4096)
        assert torch.equal(ours, theirs), text


def test_row_limit_and_dropping_oldest_history(tokenizer, config):
    history = [HistoryTurn(f"Turn {i}.", codes_of(100, i)) for i in range(5)]
    full = build_prompt("Now.", None, history, Sampling(), tokenizer, config)
    assert full.history_used == 5
    limit = len(full.rows) - 150  # two turns too many
    with pytest.raises(RequestError, match=f"exceeds the maximum allowed length of {limit} rows"):
        build_prompt("Now.", None, history, Sampling(), tokenizer, config, max_rows=limit)
    kept = build_prompt("Now.", None, history, Sampling(), tokenizer, config, max_rows=limit,
                        drop_oldest_history=True)
    assert kept.history_used == 3
    assert torch.equal(kept.rows, rows_of("Now.", None, history[2:], tokenizer, config))
    with pytest.raises(RequestError, match="shorten the text"):
        build_prompt("Now.", None, history, Sampling(), tokenizer, config, max_rows=20, drop_oldest_history=True)


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

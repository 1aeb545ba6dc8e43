"""A long scene's cuts (prefix.py `cuts`): whole 512-row chunks up to the cell of the history's
end, each boundary from there; on the tiny checkpoint, float32 on the CPU, every take whose
prefix came from the cache still equals the take prefilled from row 0, bit for bit."""

from __future__ import annotations

import pytest
import torch

from engine import EngineSpec, HistoryTurn, load_engine
from engine.drama3.prefill import GRID, cuts
from engine.drama3.prompt import Prompt
from engine.drama3.sampling import Sampling

from .test_prefix import SAMPLING, check, codes

# 80 rows a turn: the history's end is row 1,007 with 12 turns (in the cell [512, 1024)), 1,088 with 13
SCENE = [HistoryTurn(f"Line {i}, as kept.", codes(i, 40)) for i in range(13)]


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))


@pytest.fixture(scope="module")
def cold(tiny_checkpoint):
    """Each prefill from row 0 (its cache cleared before every take)."""
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))


def synthetic(boundaries: tuple[int, ...], count: int) -> Prompt:
    return Prompt(torch.zeros(count, 11, dtype=torch.long), 0, Sampling(), boundaries=boundaries)


def test_cuts_are_whole_chunks_up_to_the_last_boundarys_cell_then_each_boundary():
    assert GRID == 512
    assert cuts(synthetic((45, 125, 445), 500)) == (45, 125, 445)  # one cell: every boundary, as before
    assert cuts(synthetic((45, 300, 700, 1100, 1300), 1400)) == (512, 1024, 1100, 1300)
    assert cuts(synthetic((45, 1024), 1100)) == (512, 1024)  # a boundary on the grid is one cut
    assert cuts(synthetic((), 900)) == ()


def test_two_prompts_agree_on_their_cuts_up_to_any_point_both_cut():
    """What makes a snapshot reusable: the cuts before it (the chunks that made it) are the same."""
    turns = [45 + 80 * i for i in range(20)]
    scenes = [cuts(synthetic(tuple(turns[:n]), turns[n - 1] + 40)) for n in range(1, 20)]
    for i, a in enumerate(scenes):
        for b in scenes[i + 1:]:
            for point in set(a) & set(b):
                assert [c for c in a if c <= point] == [c for c in b if c <= point]


@torch.inference_mode()
def test_a_long_scene_resumes_at_its_cuts_and_equals_a_fresh_prefill(tiny, cold):
    tiny.decoder.prefix.clear()
    line = "Then light it again."
    history = SCENE[:12]
    prompt = tiny.prompt(line, None, history, SAMPLING)
    end = prompt.boundaries[-1]
    assert GRID < end < 2 * GRID and cuts(prompt)[0] == GRID
    # A cold prefill runs one whole chunk for the first cell, not one chunk a turn.
    prefill = tiny.decoder.begin_prefill(prompt, 0)
    assert list(prefill.chunks)[:2] == [(0, GRID), (GRID, prompt.boundaries[6])]
    tiny.decoder.release(0)
    tiny.decoder.prefix.clear()

    first = check(tiny, cold, line, None, history, 0)
    check(tiny, cold, line, None, history, len(prompt.rows))  # a retake: the whole prompt
    check(tiny, cold, "Then light it, again.", None, history, end)  # the line edited: its history's end
    shorter = tiny.prompt(line, None, history[:11], SAMPLING)  # an earlier line: its history ends in the same cell
    check(tiny, cold, line, None, history[:11], shorter.boundaries[-1])
    edited = [*history[:8], HistoryTurn("Line 8, said again.", codes(8, 40)), *history[9:]]
    check(tiny, cold, line, None, edited, prompt.boundaries[8])  # a turn in the last cell edited
    edited = [history[0], HistoryTurn("Line 1, said again.", codes(1, 40)), *history[2:]]
    check(tiny, cold, line, None, edited, 0)  # a turn in an earlier cell edited: no cut before it
    # Kept, and the next line's history ends in the next cell: it resumes at that cell's start.
    kept = [*history, HistoryTurn(line, first.codes)]
    after = tiny.prompt("Who left the lamp burning?", None, kept, SAMPLING)
    assert after.boundaries[-1] >= 2 * GRID and cuts(after)[:2] == (GRID, 2 * GRID)
    check(tiny, cold, "Who left the lamp burning?", None, kept, GRID)

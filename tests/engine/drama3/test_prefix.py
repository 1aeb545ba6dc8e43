"""The prefix cache on the tiny checkpoint, float32 on the CPU: a take whose prefix came from
the cache equals the take prefilled from row 0, bit for bit (every cache row the prompt
wrote, every DeltaNet state, the first step's inputs, the frames), whatever changed since
(a retake, a keep, a drop, a reorder, an edited line, another voice), in another slot, and
after a restart, in a long scene cut on a grid of whole chunks too (prefill.py `cuts`); stale states
are never used; memory stays within the budget."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch

from engine import Character, Done, EngineSpec, HistoryTurn, Sampling, load_engine
from engine.drama3 import prefill as prefill_module
from engine.drama3.decoder import Decoder
from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.layers import KVCache
from engine.drama3.prefill import GRAPH_CHUNK_ROWS, GRID, cuts, padded_chunks
from engine.drama3.prefix import PrefixCache
from engine.drama3.prompt import Prompt, Reference


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))


@pytest.fixture(scope="module")
def cold(tiny_checkpoint):
    """A second engine: each prefill from row 0 (its cache cleared before every take)."""
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))


def codes(seed: int, frames: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, (10, frames))


HISTORY = [HistoryTurn(f"Line {i}, as kept.", codes(i, 20 + 5 * i)) for i in range(4)]
SAMPLING = Sampling(max_new_tokens=8, seed=11)


def slot_state(decoder: Decoder, slot: int, rows: int) -> list[torch.Tensor]:
    """What a prefill of `rows` rows leaves in `slot` and in the first step's inputs."""
    model = decoder.model
    out: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, KVCache):
            out += [module.k[slot, :rows].clone(), module.v[slot, :rows].clone()]
        elif isinstance(module, GatedDeltaNet):
            out += [module.conv_state[slot].clone(), module.recurrent_state[slot].clone()]
    return out + [t[slot].clone() for t in (decoder.hidden, decoder.position, decoder.frame, decoder.ras_window)]


def prefilled(engine, prompt: Prompt, slot: int = 0) -> list[torch.Tensor]:
    decoder = engine.decoder
    decoder.prefill(prompt, slot)
    state = slot_state(decoder, slot, len(prompt.rows))
    decoder.release(slot)
    return state


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)  # bit for bit


def take(engine, prompt: Prompt) -> Done:
    done = list(engine.generate(prompt))[-1]
    assert isinstance(done, Done) and done.error is None
    return done


def from_scratch(cold, prompt: Prompt) -> tuple[list[torch.Tensor], Done]:
    assert cold.decoder.prefix is not None
    cold.decoder.prefix.clear()
    state = prefilled(cold, prompt)
    cold.decoder.prefix.clear()
    return state, take(cold, prompt)


def check(tiny, cold, text: str, voice, history: list[HistoryTurn], cached: int) -> Done:
    """The take from `tiny`'s cache restores `cached` rows and equals the take from row 0."""
    prompt = tiny.prompt(text, voice, history, SAMPLING)
    done = take(tiny, prompt)
    assert done.timings["cached_rows"] == cached
    state, fresh = from_scratch(cold, prompt)
    assert fresh.timings["cached_rows"] == 0
    assert np.array_equal(done.codes, fresh.codes)
    assert_same(prefilled(tiny, prompt), state)  # a whole-prompt hit now
    return done


@torch.inference_mode()
def test_history_changes_reuse_the_longest_shared_prefix_and_equal_a_fresh_prefill(tiny, cold):
    tiny.decoder.prefix.clear()
    line = "Then light it again."
    prompt = tiny.prompt(line, None, HISTORY, SAMPLING)
    head, *ends = prompt.boundaries
    assert len(ends) == len(HISTORY) and ends[-1] < len(prompt.rows)
    first = check(tiny, cold, line, None, HISTORY, 0)  # cold
    again = check(tiny, cold, line, None, HISTORY, len(prompt.rows))  # a retake: the whole prompt
    assert np.array_equal(first.codes, again.codes)  # same seed, same frames
    kept = [*HISTORY, HistoryTurn(line, first.codes)]
    check(tiny, cold, "Who left the lamp burning?", None, kept, ends[-1])  # keep, next line
    check(tiny, cold, "Then light it, again.", None, HISTORY, ends[-1])  # the line edited
    dropped = [HISTORY[0], *HISTORY[2:]]
    check(tiny, cold, line, None, dropped, ends[0])  # a take dropped from the history
    check(tiny, cold, line, None, HISTORY[::-1], head)  # reordered: only the system message is shared
    check(tiny, cold, line, None, HISTORY[:2], ends[1])  # an earlier line retaken: fewer turns
    voice = [Reference(codes(99, 25), "A reference clip.")]
    check(tiny, cold, line, voice, HISTORY, 0)  # another voice: nothing shared
    check(tiny, cold, line, Character("Ada", "a tired stage manager"), HISTORY, 0)
    stats = tiny.prefix_cache_stats()
    assert stats is not None and stats["hits"] >= 1 and stats["partial_hits"] >= 5 and stats["rows_saved"] > 0


@torch.inference_mode()
def test_a_snapshot_restores_into_another_slot(tiny_checkpoint):
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=2))
    prompt = engine.prompt("Across slots.", None, HISTORY[:2], SAMPLING)
    made = prefilled(engine, prompt, 0)
    assert_same(prefilled(engine, prompt, 1), made)
    assert engine.prefix_cache_stats()["hits"] == 1
    # A prompt that differs only in its line resumes at the history's end in slot 1.
    other = engine.prompt("Across slots, again.", None, HISTORY[:2], SAMPLING)
    resumed = prefilled(engine, other, 1)
    engine.decoder.prefix.clear()
    assert_same(prefilled(engine, other, 0), resumed)


@torch.inference_mode()
def test_a_restarted_engine_starts_cold_and_makes_the_same_take(tiny, tiny_checkpoint):
    prompt = tiny.prompt("Before the restart.", None, HISTORY, SAMPLING)
    take(tiny, prompt)
    cached = take(tiny, prompt)
    assert cached.timings["cached_rows"] == len(prompt.rows)
    restarted = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu"))
    fresh = take(restarted, restarted.prompt("Before the restart.", None, HISTORY, SAMPLING))
    assert fresh.timings["cached_rows"] == 0
    assert np.array_equal(cached.codes, fresh.codes)


@torch.inference_mode()
def test_a_stale_state_is_never_used(tiny):
    """Keys cover the row after a boundary (the tower's label) and the boundaries themselves."""
    cache = tiny.decoder.prefix
    cache.clear()
    prompt = tiny.prompt("Stale?", None, HISTORY[:2], SAMPLING)
    take(tiny, prompt)
    head, end = prompt.boundaries[0], prompt.boundaries[-1]
    assert cache.plan(prompt).start == len(prompt.rows)
    relabelled = prompt.rows.clone()
    relabelled[end, 0] += 1  # the row after the history: the snapshot there labelled its tower with the old one
    plan = cache.plan(Prompt(relabelled, prompt.history_used, SAMPLING, boundaries=prompt.boundaries))
    assert plan.start == prompt.boundaries[-2]
    moved = Prompt(prompt.rows, prompt.history_used, SAMPLING, boundaries=(head, end - 1))
    assert cache.plan(moved).start == head  # other chunk cuts: other keys
    changed = prompt.rows.clone()
    changed[1, 3] = 7  # a row inside the system message
    assert cache.plan(Prompt(changed, 0, SAMPLING, boundaries=prompt.boundaries)).start == 0
    assert cache.plan(Prompt(prompt.rows, 0, SAMPLING)).start == 0  # no boundaries: other chunks, no hit
    assert cache.plan(Prompt(prompt.rows[:-1], 0, SAMPLING, boundaries=prompt.boundaries)).start == end


@torch.inference_mode()
def test_eviction_keeps_the_budget_and_drops_inner_states_before_rows(tiny, cold, caplog):
    caplog.set_level(logging.INFO, logger="retake.engine")
    cache: PrefixCache = tiny.decoder.prefix
    cache.clear()
    prompt = tiny.prompt("Budget.", None, HISTORY, SAMPLING)
    take(tiny, prompt)
    held = cache.stats()["device_bytes"]
    assert held == sum(node.nbytes for node in cache.nodes.values())
    assert held == len(prompt.rows) * cache.row_bytes + len(cache.nodes) * cache.state_bytes + \
        tiny.decoder.hidden[0].numel() * 4
    budget = cache.budget
    try:
        cache.budget = held - 1  # one state too many
        cache.fit()
        stats = cache.stats()
        assert stats["device_bytes"] <= cache.budget and stats["evictions"] >= 1
        assert stats["device_bytes"] == sum(node.nbytes for node in cache.nodes.values())
        stateless = [node for node in cache.nodes.values() if not node.resumable]
        assert len(stateless) == 1 and stateless[0].children == 1  # the oldest inner snapshot lost its states only
        assert evictions(caplog) == [f"0 snapshots dropped, 1 kept their rows but lost their DeltaNet states, 0 "
                                     f"moved to the host; now {len(cache.nodes)} snapshots"]
        # A retake still hits the whole prompt, and a prefix through the stateless snapshot refills it.
        assert take(tiny, prompt).timings["cached_rows"] == len(prompt.rows)
        cache.budget = budget
        check(tiny, cold, "Budget.", None, HISTORY[:1], 0 if stateless[0].end == prompt.boundaries[1] else
              prompt.boundaries[1])
        caplog.clear()
        held = len(cache.nodes)
        cache.budget = 0
        cache.fit()
        assert cache.stats()["device_bytes"] == 0 and not cache.nodes
        assert evictions(caplog)[-1].startswith(f"{held} snapshots dropped")  # each once, whatever the order
        assert take(tiny, prompt).timings["cached_rows"] == 0  # nothing kept within no budget
        assert not cache.nodes
    finally:
        cache.budget = budget


@torch.inference_mode()
def test_a_scene_past_the_budget_keeps_the_longest_prefix_that_fits(tiny, cold):
    """Rows up to the last history take and one set of states fit, the whole prompt does not:
    the cache keeps that prefix rather than evicting it for snapshots it cannot hold."""
    cache: PrefixCache = tiny.decoder.prefix
    line = "Past the budget."
    prompt = tiny.prompt(line, None, HISTORY, SAMPLING)
    inner = prompt.boundaries[-1]
    budget = cache.budget
    try:
        cache.clear()
        cache.budget = inner * cache.row_bytes + cache.state_bytes
        take(tiny, prompt)
        assert max(node.end for node in cache.nodes.values()) == inner
        assert cache.stats()["device_bytes"] <= cache.budget
        check(tiny, cold, line, None, HISTORY, inner)  # the retake resumes there, and equals a fresh take
    finally:
        cache.budget = budget


def evictions(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the eviction log lines say went and how many snapshots are left (not their MiB)."""
    found = (re.search(r"least recently used: (.*; now \d+ snapshots)", r.getMessage()) for r in caplog.records)
    return [match.group(1) for match in found if match]


@torch.inference_mode()
def test_takes_prefilled_between_steps_record_the_same_snapshots(tiny, cold):
    """A prompt prefilled a few chunks per step while another take decodes (the slot table's
    interleaving) leaves the snapshots a whole prefill leaves."""
    cache = tiny.decoder.prefix
    cache.clear()
    slots = tiny.slot_table
    first = slots.start(tiny.prompt("Playing.", None, [], Sampling(max_new_tokens=40, seed=1)))
    while not first.decoding or first in slots.prefills:
        slots.step()
    prompt = tiny.prompt("Joining.", None, HISTORY, SAMPLING)
    slots.prefill_rows, rows = 16, slots.prefill_rows
    try:
        second = slots.start(prompt)
        events = []
        while not second.done:
            events += [e for t, es in slots.step() if t is second for e in es]
        while not first.done:
            slots.step()
    finally:
        slots.prefill_rows = rows
    state, fresh = from_scratch(cold, prompt)
    assert np.array_equal(events[-1].codes, fresh.codes)
    assert_same(prefilled(tiny, prompt), state)


def test_the_budget_option_is_checked(tiny_checkpoint):
    from engine.errors import RequestError

    with pytest.raises(RequestError, match="prefix_cache_gib"):
        load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", prefix_cache_gib=-1))
    off = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", prefix_cache_gib=0))
    assert off.decoder.prefix is None and off.prefix_cache_stats() is None


def test_on_a_gpu_the_budget_follows_the_memory_free_after_warm_up(tiny, caplog):
    """(The arithmetic, run here; tests/engine/drama3/test_prefix_gpu.py runs it at warm-up.) No
    budget given: half the free memory; one given past 90% of it: lowered to that, with a warning."""
    gib = 2**30
    default = PrefixCache(tiny.decoder.model, budget=0)
    default.fit_free_memory(8 * gib, asked=False)
    assert default.budget == 4 * gib
    asked = PrefixCache(tiny.decoder.model, budget=6 * gib)
    asked.fit_free_memory(8 * gib, asked=True)
    assert asked.budget == 6 * gib and not caplog.records  # within the free memory: as asked
    asked.fit_free_memory(4 * gib, asked=True)
    assert asked.budget == int(0.9 * 4 * gib)
    assert [r.getMessage() for r in caplog.records] == ["prefix cache: 6.0 GiB asked for, but 4.0 GiB of GPU memory "
                                                        "are free after warm-up; the budget is 3.6 GiB (give a smaller "
                                                        "--prefix-cache-gib to silence this)"]


@torch.inference_mode()
def test_a_take_restores_into_the_slot_holding_its_rows_and_copies_only_the_rest(tiny_checkpoint, cold, caplog):
    """prefix.py's rows in place: the slot that last prefilled a prompt holds its prefix; a
    take of it goes to that slot (not the lowest free one), copies only the rows the slot does
    not hold, and is the take prefilled from row 0, bit for bit."""
    caplog.set_level(logging.INFO, logger="retake.engine")
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3))
    cache = engine.decoder.prefix
    prompt = engine.prompt("In place.", None, HISTORY, SAMPLING)
    rows, history_end = len(prompt.rows), max(prompt.boundaries)
    prefilled(engine, prompt, 2)  # slot 2 prefills it and turns active: its rows in place end at the line
    caplog.clear()
    first = take(engine, prompt)
    assert first.timings["cached_rows"] == rows
    assert f"slot 2 restored the whole prompt ({rows:,} of {rows:,} rows, {history_end:,} in place)" in caplog.text
    assert cache.stats()["rows_in_place"] == history_end
    state, fresh = from_scratch(cold, prompt)
    assert np.array_equal(first.codes, fresh.codes)
    # A warm of the whole prompt (prefill only, nothing decoded after it) leaves every row in place.
    cache.clear()
    warm = engine.warm(prompt, line=True)
    assert warm is not None
    while not warm.done:
        engine.step()
    caplog.clear()
    assert_same(prefilled(engine, prompt, warm.slot), state)
    assert f"({rows:,} of {rows:,} rows, {rows:,} in place)" in caplog.text
    # Another prompt prefilled into that slot: its rows are that prompt's now, shared up to the
    # system message only, and the next take of the first copies the rest.
    other = engine.prompt("In place.", None, HISTORY[::-1], SAMPLING)
    for slot in range(3):
        prefilled(engine, other, slot)
    caplog.clear()
    again = take(engine, prompt)
    assert f"{min(prompt.boundaries):,} in place)" in caplog.text
    assert np.array_equal(again.codes, fresh.codes)


# 80 rows a turn: the history's end is row 1,007 with 12 turns (in the cell [512, 1024)), 1,088 with 13
SCENE = [HistoryTurn(f"Line {i}, as kept.", codes(i, 40)) for i in range(13)]


def synthetic(boundaries: tuple[int, ...], count: int) -> Prompt:
    return Prompt(torch.zeros(count, 11, dtype=torch.long), 0, Sampling(), boundaries=boundaries)


@pytest.fixture
def grid_512(monkeypatch):
    """Cuts on a 512-row grid (the CPU's chunk), so a scene crosses cells at the tiny size in
    a few hundred rows; the served grid is GRID (1,024 rows), laid out the same way."""
    monkeypatch.setattr(prefill_module, "GRID", 512)
    return 512


def test_a_cell_of_the_grid_is_one_whole_chunk_with_graphs():
    assert GRID == max(GRAPH_CHUNK_ROWS)
    assert padded_chunks(0, GRID, 8192) == [(0, GRID)]
    assert padded_chunks(GRID, 2 * GRID, 8192) == [(GRID, 2 * GRID)]
    assert cuts(synthetic((45, GRID + 300, 2 * GRID + 10), 2 * GRID + 50)) == (GRID, 2 * GRID, 2 * GRID + 10)


def test_cuts_are_whole_chunks_up_to_the_last_boundarys_cell_then_each_boundary(grid_512):
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
def test_a_long_scene_resumes_at_its_cuts_and_equals_a_fresh_prefill(tiny, cold, grid_512):
    tiny.decoder.prefix.clear()
    line = "Then light it again."
    history = SCENE[:12]
    prompt = tiny.prompt(line, None, history, SAMPLING)
    end = prompt.boundaries[-1]
    assert grid_512 < end < 2 * grid_512 and cuts(prompt)[0] == grid_512
    # A cold prefill runs one whole chunk for the first cell, not one chunk a turn.
    prefill = tiny.decoder.begin_prefill(prompt, 0)
    assert list(prefill.chunks)[:2] == [(0, grid_512), (grid_512, prompt.boundaries[6])]
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
    assert after.boundaries[-1] >= 2 * grid_512 and cuts(after)[:2] == (grid_512, 2 * grid_512)
    check(tiny, cold, "Who left the lamp burning?", None, kept, grid_512)

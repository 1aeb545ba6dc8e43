"""Warming the prefix cache ahead of a take (Drama3Engine.warm), float32 on the CPU: the
next line after a keep prefills only its own rows (or none, when the script held its text),
and is bit for bit the take prefilled from row 0; a warm never delays a take, ends
"prefilled" with no frames, frees its slot, and can be cancelled."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import AudioWindow, Done, EngineSpec, HistoryTurn, Sampling, load_engine
from engine.drama3 import prefix as prefix_module


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=2))


@pytest.fixture(scope="module")
def cold(tiny_checkpoint):
    """Takes prefilled from row 0 (no prefix cache)."""
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=1, prefix_cache_gib=0))


def kept(seed: int, frames: int) -> HistoryTurn:
    return HistoryTurn(f"Kept line {seed}.", np.random.default_rng(seed).integers(0, 1024, (10, frames)))


HISTORY = [kept(1, 30), kept(2, 45)]
SAMPLING = Sampling(max_new_tokens=10, seed=3)


def run(engine, *takes) -> list[AudioWindow | Done]:
    """Step until every take is done; the first one's events (the others' are read and dropped)."""
    events: list[AudioWindow | Done] = []
    while not all(take.done for take in takes):
        events += [event for t, new in engine.step() if t is takes[0] for event in new]
    return events


def test_the_next_line_after_a_warm_prefills_only_its_own_rows(engine, cold):
    cache = engine.decoder.prefix
    cache.clear()
    # What the server warms when a take is kept: the next line's prompt (its text not known yet).
    warm = engine.warm(engine.prompt("(the next line)", None, HISTORY, SAMPLING), line=False)
    assert warm is not None and warm.prefill_only
    events = run(engine, warm)
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "prefilled" and done.error is None
    assert done.codes.shape == (10, 0) and all(len(e.pcm) == 0 for e in events if isinstance(e, AudioWindow))
    assert engine.free_slots == 2 and engine.in_flight == 0
    prompt = engine.prompt("Then the lamp went out.", None, HISTORY, SAMPLING)
    end_of_history = max(prompt.boundaries)
    assert cache.stats()["misses"] == 1  # the warm's
    take = list(engine.generate(prompt))[-1]
    assert isinstance(take, Done) and take.timings["cached_rows"] == end_of_history < len(prompt.rows)
    fresh = list(cold.generate(prompt))[-1]
    assert isinstance(fresh, Done) and fresh.timings["cached_rows"] == 0
    assert np.array_equal(take.codes, fresh.codes)
    # Warming what the cache holds already, or without a cache, does nothing.
    assert engine.warm(engine.prompt("(another)", None, HISTORY, SAMPLING), line=False) is None
    assert cold.warm(prompt) is None


def test_a_line_warmed_with_its_text_restores_its_whole_prompt(engine, cold):
    cache = engine.decoder.prefix
    cache.clear()
    # The script holds the next line's text: the warm prefills the line's rows too.
    prompt = engine.prompt("Then the lamp went out.", None, HISTORY, SAMPLING)
    warm = engine.warm(prompt)
    assert warm is not None
    done = run(engine, warm)[-1]
    assert isinstance(done, Done) and done.finish_reason == "prefilled" and engine.free_slots == 2
    take = list(engine.generate(prompt))[-1]
    assert isinstance(take, Done) and take.timings["cached_rows"] == len(prompt.rows)
    fresh = list(cold.generate(prompt))[-1]
    assert isinstance(fresh, Done) and np.array_equal(take.codes, fresh.codes)
    # Another text for the line: the warm's history still serves it; its line is prefilled.
    edited = engine.prompt("Then the lamp went out, slowly.", None, HISTORY, SAMPLING)
    again = list(engine.generate(edited))[-1]
    assert isinstance(again, Done) and again.timings["cached_rows"] == max(edited.boundaries)
    assert np.array_equal(again.codes, list(cold.generate(edited))[-1].codes)  # type: ignore[union-attr]
    # The whole prompt is held now: warming it again does nothing, up to its history neither.
    assert engine.warm(prompt) is None and engine.warm(prompt, line=False) is None


def test_a_take_started_beside_a_warm_is_prefilled_first_and_is_the_same_take(engine, cold):
    engine.decoder.prefix.clear()
    slots = engine.slot_table
    rows, slots.prefill_rows = slots.prefill_rows, 8  # many chunks each
    try:
        warm = engine.warm(engine.prompt("(the next line)", None, HISTORY, SAMPLING), line=False)
        assert warm is not None
        slots.step()  # one budgeted chunk of the warm, nothing decoding
        assert warm in slots.prefills and sum(b - a for a, b in slots.prefills[warm].chunks) > 8
        prompt = engine.prompt("Meanwhile, a take.", None, [kept(9, 20)], SAMPLING)
        take = engine.start(prompt)
        warm_left = sum(b - a for a, b in slots.prefills[warm].chunks)
        slots.step()  # nothing decodes: the take's whole prefill, and the warm waits
        assert take.decoding and take not in slots.prefills
        assert sum(b - a for a, b in slots.prefills[warm].chunks) == warm_left
        events = run(engine, take, warm)
        assert warm.finish == "prefilled" and engine.in_flight == 0
    finally:
        slots.prefill_rows = rows
    fresh = list(cold.generate(prompt))[-1]
    assert isinstance(events[-1], Done) and np.array_equal(events[-1].codes, fresh.codes)


def test_a_cancelled_warm_frees_its_slot(engine):
    engine.decoder.prefix.clear()
    slots = engine.slot_table
    rows, slots.prefill_rows = slots.prefill_rows, 8
    stop = False
    try:
        warm = engine.warm(engine.prompt("(the next line)", None, HISTORY, SAMPLING), cancelled=lambda: stop,
                           line=False)
        assert warm is not None
        slots.step()
        stop = True
        done = run(engine, warm)[-1]
    finally:
        slots.prefill_rows = rows
    assert isinstance(done, Done) and done.finish_reason == "cancelled" and engine.free_slots == 2


@torch.inference_mode()
def test_a_prefill_stops_only_at_a_cut_with_a_cache(engine, cold):
    prompt = engine.prompt("A line.", None, HISTORY, SAMPLING)
    with pytest.raises(ValueError, match="cuts"):
        engine.decoder.begin_prefill(prompt, 0, stop=max(prompt.boundaries) + 1)
    with pytest.raises(ValueError, match="prefix cache"):
        cold.decoder.begin_prefill(prompt, 0, stop=max(prompt.boundaries))


@pytest.mark.parametrize("order", ["least recently used", "keep warms", "a warm held past WARM_HOLD_S"])
def test_a_warm_waits_in_a_full_cache_for_its_take(engine, order, monkeypatch):
    """A cache that holds one director's snapshots: a warm for director A, then director B's
    take. Least recently used drops A's warm for B's snapshots, and A's take prefills its line
    again; with `keep_warms` (the default) the warm goes last and A's take restores its whole
    prompt, after which it waits no more; a warm older than WARM_HOLD_S goes as any other."""
    cache = engine.decoder.prefix
    cache.clear()
    budget = cache.budget
    line_a = engine.prompt("Director A's line.", None, [kept(5, 30), kept(6, 40)], SAMPLING)
    line_b = engine.prompt("Director B's line.", None, [kept(7, 35), kept(8, 45)], SAMPLING)
    monkeypatch.setattr(cache, "keep_warms", order != "least recently used")
    try:
        warm = engine.warm(line_a)
        assert warm is not None
        run(engine, warm)
        waiting = [node for node in cache.nodes.values() if node.waiting is not None]
        assert len(waiting) == 1 and waiting[0].end == len(line_a.rows)  # the warm's last snapshot
        if order == "a warm held past WARM_HOLD_S":
            monkeypatch.setattr(prefix_module, "WARM_HOLD_S", 0.0)
        cache.budget = cache.stats()["device_bytes"]  # room for A's snapshots, no more
        list(engine.generate(line_b))
        assert cache.stats()["device_bytes"] <= cache.budget and cache.stats()["evictions"] >= 1
        take = list(engine.generate(line_a))[-1]
        assert isinstance(take, Done) and take.error is None
        if order == "keep warms":
            assert take.timings["cached_rows"] == len(line_a.rows)  # the whole prompt: nothing prefilled
            assert waiting[0].waiting is None  # its take came
        else:
            assert take.timings["cached_rows"] < len(line_a.rows)
    finally:
        cache.budget = budget
        cache.clear()


def test_directors_in_turn_find_their_warms_in_a_short_cache(engine):
    """Four directors take a line each in turn, keep it and warm their next line, three rounds,
    with room for about three of their four snapshot chains. With `keep_warms` more of their
    takes restore their whole prompt than with least recently used first, which drops each
    warm before its take comes (docs/perf.md, stop 55)."""
    cache = engine.decoder.prefix
    budget, keep = cache.budget, cache.keep_warms
    whole: dict[bool, int] = {}
    try:
        for keep_warms in (False, True):
            cache.clear()
            cache.budget, cache.keep_warms = budget, keep_warms
            history = {i: [kept(10 + i, 20)] for i in range(4)}
            whole[keep_warms] = 0
            for round_ in range(3):
                for i in range(4):
                    prompt = engine.prompt(f"Line {round_} of director {i}.", None, history[i], SAMPLING)
                    done = list(engine.generate(prompt))[-1]
                    assert isinstance(done, Done) and done.error is None
                    whole[keep_warms] += round_ > 0 and done.timings["cached_rows"] == len(prompt.rows)
                    history[i] = [*history[i], HistoryTurn(f"Line {round_} of director {i}.", done.codes)]
                    warm = engine.warm(engine.prompt(f"Line {round_ + 1} of director {i}.", None, history[i],
                                                     SAMPLING))
                    if warm is not None:
                        run(engine, warm)
                    if round_ == 0 and i == 0:  # one director's chain, its warm included, 3 times over
                        cache.budget = 3 * cache.stats()["device_bytes"]
        assert whole[True] > whole[False], whole
        assert whole[True] >= 4, whole  # of the 8 takes after the first round (6 when written, LRU 0)
    finally:
        cache.budget, cache.keep_warms = budget, keep
        cache.clear()


def test_a_take_restored_whole_decodes_while_the_playback_limit_holds_prompts_back(tiny_checkpoint, monkeypatch):
    """Stop 57's H100: takes whose prompts the cache restored whole (48 listening directors' every
    take) waited up to 782 ms for first audio, held back by the playback limit with nothing to
    prefill. Such a take decodes from the next step now; a take with rows to prefill is still held."""
    from engine.drama3 import slots as slots_module

    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3))
    table = engine.slot_table
    warmed = engine.prompt("Then the lamp went out.", None, HISTORY, SAMPLING)
    run(engine, engine.warm(warmed))
    playing = engine.start(engine.prompt("A take that plays.", None, [], Sampling(max_new_tokens=40, seed=1)))
    while playing in table.prefills:
        engine.step()
    # The playing take needs every step short: no prompt rows beside it (a clock never decides here).
    monkeypatch.setattr(table.admission, "rows", lambda limit_s=None: 0)
    monkeypatch.setattr(slots_module, "HELD_S", float("inf"))
    restored = engine.start(warmed)
    fresh = engine.start(engine.prompt("A line nobody warmed.", None, HISTORY, SAMPLING))
    assert not table.prefills[restored].chunks and restored.timings["cached_rows"] == len(warmed.rows)
    assert table.prefills[fresh].chunks
    engine.step()
    assert fresh in table.prefills and table.held  # held back: its rows would lengthen the step
    assert restored not in table.prefills and restored in table.decoding()  # nothing to hold back
    events = run(engine, restored, playing, fresh)
    assert isinstance(events[-1], Done) and events[-1].finish_reason in ("stop", "length")

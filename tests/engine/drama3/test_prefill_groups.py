"""Waiting prompts' next chunks prefilled as one batched chunk (prefill_groups.py), on the tiny
checkpoint in float32 on the CPU, where groups are off unless asked for: a prompt prefilled in
groups leaves the state it leaves alone (to float32 rounding: a GEMM's blocking follows its
rows), takes started together through the slot table run in groups and end well, and the
prefix cache's snapshots a group leaves are that group's state, bit for bit."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from engine import Done, EngineSpec, HistoryTurn, Sampling, load_engine
from engine.drama3.prefill import Prefill
from engine.drama3.prefill_groups import GROUP_SHAPES

from .test_prefix import slot_state


@pytest.fixture(scope="module")
def grouped(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=4, prefill_group=8))


@pytest.fixture(scope="module")
def single(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=1))


def history(turns: int) -> list[HistoryTurn]:
    rng = np.random.default_rng(turns)
    return [HistoryTurn(f"Line {i}, as kept.", rng.integers(0, 1024, (10, 12 + 7 * i))) for i in range(turns)]


def prompts(engine, count: int = 4) -> list:
    """Prompts of different lengths, with histories: several chunks each (cut at their turns)."""
    return [engine.prompt(f"Take {i}: " + "again, " * i, None, history(i), Sampling(max_new_tokens=12, seed=i))
            for i in range(count)]


class Counted:
    """The decoder's grouped chunks, counted (each call still runs)."""

    def __init__(self, decoder) -> None:
        self.decoder, self.run, self.sizes = decoder, decoder.prefill_group, []

    def __call__(self, group: list[Prefill]) -> list[bool]:
        self.sizes.append(len(group))
        return self.run(group)


@torch.inference_mode()
def test_a_prompt_prefilled_in_groups_leaves_the_state_it_leaves_alone(grouped, single, monkeypatch):
    decoder = grouped.decoder
    decoder.prefix.clear()
    single.decoder.prefix.clear()
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    takes = prompts(grouped)
    decoder.prefill_together([decoder.begin_prefill(prompt, slot) for slot, prompt in enumerate(takes)])
    sizes = counted.sizes
    assert max(sizes) == len(takes) and len(sizes) > 1  # all four at once, over several chunks each
    for slot, prompt in enumerate(takes):
        assert bool(decoder.active[slot])
        got = slot_state(decoder, slot, len(prompt.rows))
        single.decoder.prefill(prompt, 0)
        want = slot_state(single.decoder, 0, len(prompt.rows))
        single.decoder.release(0)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            error, scale = (a.double() - b.double()).abs().max(), b.double().abs().max()
            assert error <= 1e-4 * scale + 1e-6, (error, scale)  # float32 rounding, through every layer
        decoder.release(slot)


def test_takes_started_together_prefill_in_groups_and_a_retake_restores_the_group_state(grouped, monkeypatch):
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    takes = prompts(grouped)
    started = [table.start(prompt) for prompt in takes]
    events: dict[int, list] = {take.slot: [] for take in started}
    while any(not take.done for take in started):
        for take, new in table.step():
            events[take.slot] += new
    assert counted.sizes and max(counted.sizes) == len(takes)  # nothing decoded yet: all four in the first group
    dones = [events[take.slot][-1] for take in started]
    assert all(isinstance(done, Done) and done.finish_reason in ("stop", "length") and done.codes.shape[1] > 0
               for done in dones)  # (which, and how many frames, follows this machine's float rounding)
    # A retake restores each whole prompt from the snapshots the groups recorded: the same frames.
    hits = decoder.prefix.counters.hits
    for prompt, done in zip(takes, dones, strict=True):
        again = list(grouped.generate(prompt))[-1]
        assert np.array_equal(again.codes, done.codes)
    assert decoder.prefix.counters.hits == hits + len(takes)


def test_a_step_budget_counts_a_group_as_its_longest_chunk(grouped, monkeypatch):
    """While a take decodes, a step prefills about its budget of rows; a group costs about what
    its longest chunk costs alone (the weights read once), so a budget of 128 rows runs more
    than one group of three prompts' ~50-row chunks, and the pace line counts every row."""
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    playing, *waiting = prompts(grouped)
    monkeypatch.setattr(table, "prefill_rows", 128)  # the budget, whatever this machine's speed
    first = table.start(playing)
    while first in table.prefills:
        table.step()
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    started = [table.start(prompt) for prompt in waiting]
    before = {take: list(table.prefills[take].chunks) for take in started}
    table.step()
    assert first.decoding and len(counted.sizes) >= 2, counted.sizes  # counting every row: one group
    ran = [chunk for take in started
           for chunk in before[take][:len(before[take]) - len(table.prefills[take].chunks if take in table.prefills
                                                                else ())]]
    assert len(ran) == sum(counted.sizes)  # every chunk of the step ran in a group
    assert table.beside == sum(end - start for start, end in ran) > 128  # the pace line's rows: all of them
    while any(not take.done for take in [first, *started]):
        table.step()


def test_a_warm_rides_in_the_rows_a_group_of_takes_leaves(grouped, monkeypatch):
    """The server's warm of a next line (a prefill-only take) joins the takes' group where the
    shape has rows to spare and its chunk is no longer than theirs: it costs the group nothing;
    it ends "prefilled", and the line after restores what it prefilled."""
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    takes = [table.start(prompt) for prompt in prompts(grouped, 3)[1:]]  # two takes with histories
    warm = grouped.warm(grouped.prompt("(not written yet)", None, history(3), Sampling(max_new_tokens=1)),
                        line=False)
    assert warm is not None and warm.prefill_only
    table.step()
    assert counted.sizes[0] == 3  # the two takes and the warm, in the first group
    while any(not take.done for take in [*takes, warm]):
        table.step()
    assert warm.finish == "prefilled" and table.free_slots == 4
    line = grouped.prompt("The line after.", None, history(3), Sampling(max_new_tokens=4, seed=3))
    done = list(grouped.generate(line))[-1]
    assert isinstance(done, Done) and done.timings["cached_rows"] == max(line.boundaries)


def test_a_long_chunk_first_keeps_no_group_from_running_while_nothing_decodes(grouped, monkeypatch):
    decoder, table = grouped.decoder, grouped.slot_table
    monkeypatch.setattr(decoder, "prefix", None)  # no cache: a prompt is one chunk (512 rows at most)
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    turn = HistoryTurn("A long kept take.", np.random.default_rng(9).integers(0, 1024, (10, 300)))
    long = grouped.prompt("After a long take.", None, [turn], Sampling(max_new_tokens=4, seed=9))
    short = [grouped.prompt(f"Short {i}.", None, [], Sampling(max_new_tokens=4, seed=i)) for i in range(3)]
    started = [table.start(prompt) for prompt in [long, *short]]
    table.step()  # nothing decodes: every prompt prefilled in this step
    assert len(long.rows) > 128 and counted.sizes == [3]  # the three short ones together; the long one alone
    assert all(take.decoding and take not in table.prefills for take in started)
    while any(not take.done for take in started):
        table.step()


@torch.inference_mode()
def test_long_chunks_cut_to_join_a_group_leave_the_state_they_leave_alone(grouped, single, monkeypatch):
    """Prompts whose chunks are longer than every shape, waiting together: their first rows run
    as one group, cut to its shape (prefill_groups.py `cut`), then the rest; each prompt's
    state is the one it has prefilled alone (to float32 rounding)."""
    decoder = grouped.decoder
    monkeypatch.setattr(decoder, "prefix", None)  # no cache: a prompt is one chunk (512 rows at most)
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    rng = np.random.default_rng(11)
    kept = [HistoryTurn("A kept take.", rng.integers(0, 1024, (10, 150 + 30 * i))) for i in range(4)]
    takes = [grouped.prompt(f"Long {i}.", None, [turn], Sampling(max_new_tokens=4, seed=i))
             for i, turn in enumerate(kept)]
    prefills = [decoder.begin_prefill(prompt, slot) for slot, prompt in enumerate(takes)]
    assert all(len(p.chunks) == 1 and p.chunks[0][1] - p.chunks[0][0] > GROUP_SHAPES[-1][1] for p in prefills)
    decoder.prefill_together(prefills)
    assert counted.sizes and counted.sizes[0] == 4  # the four long chunks' first rows, together
    for slot, prompt in enumerate(takes):
        got = slot_state(decoder, slot, len(prompt.rows))
        single.decoder.prefill(prompt, 0)
        want = slot_state(single.decoder, 0, len(prompt.rows))
        single.decoder.release(0)
        for a, b in zip(got, want, strict=True):
            error, scale = (a.double() - b.double()).abs().max(), b.double().abs().max()
            assert error <= 1e-4 * scale + 1e-6, (error, scale)
        decoder.release(slot)


def test_long_chunks_waiting_beside_a_playing_take_run_cut_in_a_group_and_end_well(tiny_checkpoint, monkeypatch):
    """The server's case (stop 41's H100, 64 directors): while a take decodes, four second takes
    wait, each chunk longer than every shape: the step runs their first 128 rows as one group
    (the first waiting take's too, so it is never passed over), and every take ends well."""
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=5, prefill_group=8,
                                    prefix_cache_gib=0))  # no cache: a prompt is one chunk
    decoder, table = engine.decoder, engine.slot_table
    playing = table.start(engine.prompt("Playing.", None, [], Sampling(max_new_tokens=40, seed=1)))
    while playing in table.prefills:
        table.step()
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    monkeypatch.setattr(table, "prefill_rows", 128)  # the budget: one group's worth, whatever this machine's speed
    rng = np.random.default_rng(12)
    second = [engine.prompt(f"Second take {i}.", None, [HistoryTurn("Kept.", rng.integers(0, 1024, (10, 160)))],
                            Sampling(max_new_tokens=6, seed=i)) for i in range(4)]
    started = [table.start(prompt) for prompt in second]
    chunks = [table.prefills[take].chunks[0] for take in started]
    assert all(end - first > GROUP_SHAPES[-1][1] for first, end in chunks)  # each longer than every shape
    table.step()
    assert playing.decoding and counted.sizes[:1] == [4], counted.sizes
    while any(not take.done for take in [playing, *started]):
        for _, events in table.step():
            for event in events:
                if isinstance(event, Done):
                    assert event.finish_reason in ("stop", "length"), event.error


def test_which_chunks_join_a_group(grouped):
    groups, width = grouped.decoder.groups, grouped.config.frame_width
    limit = groups.chunked.max_rows

    def waiting(first: int, end: int) -> Prefill:
        rows = torch.zeros((end, width), dtype=torch.long)
        return Prefill(rows, rows, 0, collections.deque([(first, end)]))

    (takes, small), (_, large) = GROUP_SHAPES
    assert groups.pick([waiting(0, small)] * 2) and len(groups.pick([waiting(0, 10)] * 12)) == takes
    assert groups.pick([waiting(0, 10)]) == []  # one prompt: alone
    assert groups.pick([waiting(0, large + 1), waiting(0, 10)]) == []  # the first chunk is long: alone first
    # ...unless three others fill the shape with it and the four prefill at least its rows: long chunks cut
    long, also_long, rest, short = waiting(0, 255), waiting(40, 300), waiting(0, 50), waiting(0, 5)
    assert groups.pick([long, also_long, rest]) == [] and list(long.chunks) == [(0, 255)]  # 3: alone, uncut
    assert groups.pick([long, short, short, short]) == []  # 143 rows < 255
    assert groups.pick([long, also_long, rest, short, short]) == [long, also_long, rest, short]  # 311 >= 255
    assert list(long.chunks) == [(0, large), (large, 255)]
    assert list(also_long.chunks) == [(40, 40 + large), (40 + large, 300)] and list(rest.chunks) == [(0, 50)]
    # The shape that holds the first chunk and takes the most prompts; the others wait.
    first, longer, short = waiting(0, small), waiting(0, small + 1), waiting(5, 20)
    assert groups.pick([first, longer, short]) == [first, longer, short]  # 3 in the larger shape, 2 in the smaller
    assert groups.pick([first, longer, *[short] * 7]) == [first, *[short] * 7]  # 8 in the smaller, 4 in the larger
    assert groups.pick([longer, short, short]) == [longer, short, short]
    assert len(groups.pick([longer, waiting(0, large)] * 4)) == GROUP_SHAPES[1][0]
    assert groups.pick([waiting(limit - 10, limit - 1)] * 2) == []  # padded, it would pass the cache's last row
    # Warms fill the rows a group leaves, with chunks no longer than its longest.
    pair, rider, too_long = [waiting(0, 30), waiting(0, 40)], waiting(0, 40), waiting(0, 41)
    assert groups.fill(pair, [too_long, rider, rider]) == [rider, rider]
    assert len(groups.fill(pair, [rider] * 10)) == takes - 2
    groups.most, most = 1, groups.most
    try:
        assert groups.pick([waiting(0, 10)] * 2) == []  # groups off
    finally:
        groups.most = most


@torch.inference_mode()
def test_warms_waiting_together_prefill_in_a_group(grouped, monkeypatch):
    """The next lines' warms (prefill-only takes) waiting at once run their chunks as one group,
    as takes do, and end "prefilled" with their snapshots kept: each next line restores its prefix."""
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    counted = Counted(decoder)
    monkeypatch.setattr(decoder, "prefill_group", counted)
    lines = [grouped.prompt(f"Next line {i}.", None, history(i + 1), Sampling(max_new_tokens=4, seed=i))
             for i in range(3)]
    warms = [grouped.warm(line, line=False) for line in lines]
    assert all(warm is not None and warm.prefill_only for warm in warms)
    while any(not warm.done for warm in warms):  # type: ignore[union-attr]
        table.step()
    assert counted.sizes and counted.sizes[0] == 3  # the three warms' first chunks: one group
    assert all(warm.finish == "prefilled" for warm in warms) and table.free_slots == 4  # type: ignore[union-attr]
    for line in lines:
        done = list(grouped.generate(line))[-1]
        assert isinstance(done, Done) and done.error is None and done.timings["cached_rows"] == max(line.boundaries)

"""Decode steps that carry several waiting prompts' chunks together (mixed.py `step_group`), on
the tiny checkpoint in float32 on the CPU, where mixed steps and prefill groups are off unless
asked for: each such step samples the frames a plain step samples, every carried prompt's slot
ends in the state its chunks leave alone (to float32 rounding: the experts' GEMMs see more
rows), and takes started together while another plays ride the steps together (warms in the
rows they leave) and end well."""

from __future__ import annotations

import pytest
import torch

from engine import Done, EngineSpec, Sampling, load_engine

from .test_mixed import close
from .test_prefill_groups import history, prompts
from .test_prefix import slot_state

SLOTS = 6  # two decoding, up to four carried


@pytest.fixture(scope="module")
def grouped(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=SLOTS, mixed_step=True,
                                  prefill_group=8, mixed_group=True))


@pytest.fixture(scope="module")
def plain(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=SLOTS))


def test_grouped_mixed_steps_only_when_asked_and_where_groups_are(grouped, plain, tiny_checkpoint):
    assert grouped.decoder.mixed.grouped and grouped.decoder.mixed.group_rows == 512
    assert not plain.decoder.mixed.grouped
    one = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=2, mixed_step=True,
                                 prefill_group=8))  # the default: one prompt a step (stop 57's H100)
    assert one.decoder.mixed.enabled and not one.decoder.mixed.grouped
    alone = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=2, mixed_step=True,
                                   mixed_group=True))  # asked, but prefill groups are off (1 on a CPU)
    assert alone.decoder.mixed.enabled and not alone.decoder.mixed.grouped


@torch.inference_mode()
def test_a_step_carrying_a_group_is_the_step_and_each_prompt_alone(grouped, plain):
    first, second, *carried_prompts = prompts(grouped, SLOTS)
    for engine in (grouped, plain):
        engine.decoder.prefix.clear()
        engine.decoder.prefill(first, 0)
        engine.decoder.prefill(second, 1)
    decoder, rows = grouped.decoder, [0, 1]
    waiting = [decoder.begin_prefill(prompt, slot) for slot, prompt in enumerate(carried_prompts, start=2)]
    chunks = sum(len(prefill.chunks) for prefill in waiting)
    sizes, steps = [], 0
    while left := [prefill for prefill in waiting if prefill.chunks]:
        position = max(int(decoder.position[row]) for row in rows)
        if group := decoder.mixed.pick(left, position):
            sizes.append(len(group))
            decoder.mixed.step_group(position, rows, group)
        else:
            decoder.mixed.step(position, rows, left[0])
        plain.decoder.step(position, rows)
        steps += 1
        got, want = decoder.read_status(), plain.decoder.read_status()
        assert got[:2] == want[:2]  # the decoding rows' frames: the same
        for name in ("hidden", "position", "frame", "ras_window"):
            close(getattr(decoder, name)[:2], getattr(plain.decoder, name)[:2])
    assert sizes and sizes[0] == len(carried_prompts) and steps < chunks  # several prompts a step
    assert all(bool(decoder.active[slot]) for slot in range(2, SLOTS))
    for slot, prompt in enumerate(carried_prompts, start=2):  # each prompt alone, whole, in the plain decoder
        plain.decoder.prefill(prompt, slot)
        for got_state, want_state in zip(slot_state(decoder, slot, len(prompt.rows)),
                                         slot_state(plain.decoder, slot, len(prompt.rows)), strict=True):
            close(got_state, want_state)
    for engine in (grouped, plain):
        for slot in range(SLOTS):
            engine.decoder.release(slot)


class Groups:
    """The grouped mixed steps the slot table runs, counted (each call still runs)."""

    def __init__(self, decoder) -> None:
        self.run, self.sizes = decoder.mixed.step_group, []

    def __call__(self, position, rows, group) -> list[bool]:
        self.sizes.append(len(group))
        return self.run(position, rows, group)


def test_takes_asking_together_while_one_plays_ride_the_steps_together(grouped, monkeypatch):
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    groups = Groups(decoder)
    monkeypatch.setattr(decoder.mixed, "step_group", groups)
    playing_prompt, *asking = prompts(grouped, 4)
    playing = table.start(playing_prompt)
    events: dict[int, list] = {}
    while len(events.get(playing.slot, [])) < 2:  # it plays
        for take, new in table.step():
            events.setdefault(take.slot, []).extend(new)
    warm = table.start(asking[0], stop=len(asking[0].rows))  # the next line's warm, asked before the takes
    started = [table.start(prompt) for prompt in asking]
    plan = table.carried()
    assert plan is not None and [take for take, _ in plan.prompts][:len(started)] == started  # takes first
    assert plan.size == decoder.mixed.group_rows
    while any(not take.done for take in [playing, warm, *started]):
        for take, new in table.step():
            events.setdefault(take.slot, []).extend(new)
    assert groups.sizes and groups.sizes[0] == len(started) + 1  # the three takes, and the warm in a row left
    assert warm.done
    for take in [playing, *started]:
        done = events[take.slot][-1]
        assert isinstance(done, Done) and done.finish_reason in ("stop", "length") and done.codes.shape[1] > 0


def test_warms_waiting_alone_ride_one_a_step(grouped, monkeypatch):
    """Three next lines' warms asked while a take plays (no take waits): each step carries one
    warm, as without groups (stop 57's H100: groups of warms lengthened the steps and the gaps)."""
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    groups = Groups(decoder)
    monkeypatch.setattr(decoder.mixed, "step_group", groups)
    monkeypatch.setattr(table, "playback_limit", lambda: None)  # playback allows any step: no clock in the test
    playing_prompt, *lines = prompts(grouped, 4)
    playing = table.start(playing_prompt)
    while playing in table.prefills:
        table.step()
    warms = [table.start(prompt, stop=len(prompt.rows)) for prompt in lines]
    carried = 0
    while any(not warm.done for warm in warms) and not playing.done:
        plan = table.carried() if table.decoding() else None  # (as `step` asks it)
        assert plan is None or len(plan.prompts) == 1, plan
        carried += plan is not None and plan.size > 0
        table.step()
    assert not groups.sizes and carried  # warms rode the steps, one at a time
    table.drop(playing)


def steps_to_prefill(engine, asking: int) -> tuple[int, int]:
    """`asking` takes started at once while two others play: the decode steps until every one
    of them decodes, and the chunks their prompts ran in (the history cuts each in two)."""
    table = engine.slot_table
    engine.decoder.prefix.clear()

    def prompt(i: int, turns: int) -> object:
        return engine.prompt(f"Director {i}: " + "again, " * (i % 5), None, history(turns),
                             Sampling(max_new_tokens=400, seed=i))

    playing = [table.start(prompt(100 + i, 0)) for i in range(2)]
    while any(take in table.prefills for take in playing):
        table.step()
    started = [table.start(prompt(i, 1)) for i in range(asking)]
    chunks = sum(len(table.prefills[take].chunks) for take in started)
    steps = 0
    while any(take in table.prefills for take in started):
        table.step()
        steps += 1
    for take in (*playing, *started):
        table.drop(take)
    return steps, chunks


def test_sixteen_directors_asking_at_once_wait_a_fraction_of_the_steps(tiny_checkpoint):
    """Counts, not times: 16 prompts of ~100 rows (two chunks each) ride 32 steps one prompt a
    step (the default), and under a third of that in groups (`--mixed-step groups`)."""
    counts = {}
    for group in (True, False):
        engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=18, mixed_step=True,
                                        prefill_group=8, mixed_group=group))
        counts[group] = steps_to_prefill(engine, 16)
    (grouped_steps, chunks), (one_steps, same_chunks) = counts[True], counts[False]
    assert chunks == same_chunks == one_steps == 32  # one chunk a step
    assert grouped_steps * 3 <= one_steps, counts


def test_a_failed_group_step_ends_its_takes_and_every_carried_one_and_the_table_goes_on(grouped, monkeypatch):
    decoder, table = grouped.decoder, grouped.slot_table
    decoder.prefix.clear()
    playing_prompt, *asking = prompts(grouped, 4)
    playing = table.start(playing_prompt)
    while playing not in table.decoding():
        table.step()
    carried = [table.start(prompt) for prompt in asking]
    run = decoder.mixed.step_group

    def failing(*args, **kwargs) -> list[bool]:
        monkeypatch.setattr(decoder.mixed, "step_group", run)  # once
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(decoder.mixed, "step_group", failing)
    events = {id(take): [] for take in (playing, *carried)}
    for take in (playing, *carried):
        while not take.done:
            for other, new in table.step():
                events.setdefault(id(other), []).extend(new)
        done = events[id(take)][-1]
        assert isinstance(done, Done) and done.finish_reason == "error" and "a kernel failed" in done.error
    assert table.free_slots == decoder.num_slots and not table.prefills  # every slot back
    after = list(grouped.generate(asking[0]))[-1]  # the table goes on
    assert isinstance(after, Done) and after.finish_reason in ("stop", "length") and after.codes.shape[1] > 0

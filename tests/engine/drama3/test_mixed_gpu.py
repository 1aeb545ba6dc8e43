"""On a GPU, where mixed steps are on: every (row bucket, chunk size) is captured as CUDA graphs,
a prompt carried by the steps of two playing takes ends as close to the exact state as the
prompt prefilled alone (the exact state: the CPU's float32 prefill; the distance posed as in
test_prefill_groups_gpu.py, where its reason is), and takes started while another plays ride
its steps and end well; with `--mixed-step groups`, prompts carried together as well."""

from __future__ import annotations

import pytest
import torch

from engine import Done, EngineSpec, load_engine

from .test_mixed import Carried, carry_third
from .test_prefill_groups import prompts
from .test_prefill_groups_gpu import distance
from .test_prefix import slot_state

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def grouped_engine(tiny_checkpoint):
    """`gpu_engine` with grouped mixed steps (`retake serve --mixed-step groups`; off by default)."""
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cuda", slots=4, mixed_group=True))
    engine.warm_up()  # captures the graphs, the groups' among them
    return engine


@torch.inference_mode()
def test_a_carried_prompt_replays_as_graphs_and_ends_as_close_as_alone(gpu_engine, cpu_exact):
    decoder = gpu_engine.decoder
    graphs = decoder.mixed.graphs()
    assert decoder.mixed.enabled and graphs and all(g.graphs and not g.eager for g in graphs)
    decoder.prefix.clear()
    takes = prompts(gpu_engine, 3)
    third = takes[2]
    steps = carry_third(decoder, takes)  # (the playing rows' logits finite at every step)
    mixed_state = slot_state(decoder, 2, len(third.rows))
    for slot in range(3):
        decoder.release(slot)
    assert steps > 1  # its chunks over several steps
    as_close_as_alone(mixed_state, third, decoder, cpu_exact)


def as_close_as_alone(state: list[torch.Tensor], prompt, decoder, cpu_exact) -> None:
    """A carried prompt's slot `state` is as close to the CPU's exact state of the prompt as the
    GPU's prefill of it alone is (twice its distance, at most)."""
    decoder.prefix.clear()
    decoder.prefill(prompt, 0)
    alone = slot_state(decoder, 0, len(prompt.rows))
    decoder.release(0)
    cpu_exact.decoder.prefix.clear()
    cpu_exact.decoder.prefill(prompt, 0)
    exact = slot_state(cpu_exact.decoder, 0, len(prompt.rows))
    cpu_exact.decoder.release(0)
    for index, (got, single, truth) in enumerate(zip(state, alone, exact, strict=True)):
        apart, alone_apart = distance(got, truth), distance(single, truth)
        assert apart <= 2 * alone_apart + 1e-3, (index, tuple(truth.shape), apart, alone_apart)


def test_takes_started_while_one_plays_ride_its_steps_and_end_well(gpu_engine, monkeypatch):
    decoder, table = gpu_engine.decoder, gpu_engine.slot_table
    decoder.prefix.clear()
    carried = Carried(decoder)
    monkeypatch.setattr(decoder.mixed, "step", carried)
    monkeypatch.setattr(table, "prefill_rows", 256)  # every step carries (not what playback allows: a test of the ride)
    first, *later = prompts(gpu_engine, 3)
    started = [table.start(first)]
    ended: dict[int, Done] = {}
    while started[0] not in table.decoding():  # its prompt prefilled alone: nothing decodes yet
        table.step()
    started += [table.start(prompt) for prompt in later]
    while any(not take.done for take in started):
        for take, events in table.step():
            ended.update((take.slot, event) for event in events if isinstance(event, Done))
    assert carried.rows
    assert len(ended) == len(started)
    assert all(done.finish_reason in ("stop", "length") and done.codes.shape[1] > 0 for done in ended.values())


@torch.inference_mode()
def test_prompts_carried_together_replay_as_graphs_and_end_as_close_as_alone(grouped_engine, cpu_exact):
    decoder = grouped_engine.decoder
    mixed = decoder.mixed
    assert mixed.grouped and all(g.graphs and not g.eager for feeds in mixed.group_feeds.values()
                                 for g in feeds.values())
    decoder.prefix.clear()
    first, second, *carried = prompts(grouped_engine, 4)
    decoder.prefill(first, 0)
    decoder.prefill(second, 1)
    waiting = [decoder.begin_prefill(prompt, slot) for slot, prompt in enumerate(carried, start=2)]
    grouped = 0
    while left := [prefill for prefill in waiting if prefill.chunks]:
        position = max(int(decoder.position[row]) for row in (0, 1))
        if group := mixed.pick(left, position):
            grouped += 1
            mixed.step_group(position, [0, 1], group)
        else:
            mixed.step(position, [0, 1], left[0])
        assert all(row[0] == 1 for row in decoder.read_status()[:2])  # the playing rows' logits finite
    assert grouped
    states = [slot_state(decoder, slot, len(prompt.rows)) for slot, prompt in enumerate(carried, start=2)]
    for slot in range(4):
        decoder.release(slot)
    for prompt, state in zip(carried, states, strict=True):
        as_close_as_alone(state, prompt, decoder, cpu_exact)

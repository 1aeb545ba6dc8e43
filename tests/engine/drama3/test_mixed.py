"""Decode steps that carry a waiting prompt's chunk (mixed.py), on the tiny checkpoint in float32
on the CPU, where they are off unless asked for: each mixed step samples the frames a plain step
samples and leaves the decoding rows' state it leaves, the carried prompt's slot ends in the
state its chunks leave alone (to float32 rounding: the experts' GEMMs see more rows), and takes
started while others play go through the slot table in mixed steps and end well."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from engine import Done, EngineSpec, load_engine
from engine.drama3.mixed import MIXED_ROWS
from engine.drama3.slots import Carry
from engine.drama3.stream import Window

from .test_prefill_groups import prompts
from .test_prefix import slot_state


@pytest.fixture(scope="module")
def mixed(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3, mixed_step=True))


@pytest.fixture(scope="module")
def plain(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    error, scale = (got.double() - want.double()).abs().max(), want.double().abs().max()
    assert error <= 1e-4 * scale + 1e-6, (error, scale)  # float32 rounding, through every layer


def test_mixed_steps_are_on_only_where_asked_on_a_cpu(mixed, plain):
    assert mixed.decoder.mixed.enabled and mixed.decoder.mixed.sizes == list(MIXED_ROWS)
    assert not plain.decoder.mixed.enabled


@torch.inference_mode()
def test_a_step_carrying_a_chunk_is_the_step_and_the_chunk_apart(mixed, plain):
    first, second, third = prompts(mixed, 3)  # the third: a history of two turns, several chunks
    for engine in (mixed, plain):
        engine.decoder.prefix.clear()
        engine.decoder.prefill(first, 0)
        engine.decoder.prefill(second, 1)
    carried = mixed.decoder.begin_prefill(third, 2)
    alone = plain.decoder.begin_prefill(third, 2)
    assert list(carried.chunks) == list(alone.chunks) and len(carried.chunks) > 1
    steps = 0
    while True:
        rows = [0, 1]
        position = max(int(mixed.decoder.position[row]) for row in rows)
        done = mixed.decoder.mixed.step(position, rows, carried)
        plain.decoder.step(position, rows)
        plain.decoder.prefill_more(alone, rows=1, largest=max(MIXED_ROWS))  # the same chunk, alone
        steps += 1
        got, want = mixed.decoder.read_status(), plain.decoder.read_status()
        assert got[:2] == want[:2]  # the frames sampled: the same
        for name in ("hidden", "position", "frame", "ras_window"):  # the decoding rows' next inputs
            close(getattr(mixed.decoder, name)[:2], getattr(plain.decoder, name)[:2])
        assert list(carried.chunks) == list(alone.chunks)
        if done:
            break
    assert steps > 1 and not alone.chunks and bool(mixed.decoder.active[2]) and bool(plain.decoder.active[2])
    for got_state, want_state in zip(slot_state(mixed.decoder, 2, len(third.rows)),
                                     slot_state(plain.decoder, 2, len(third.rows)), strict=True):
        close(got_state, want_state)
    for engine in (mixed, plain):
        for slot in range(3):
            engine.decoder.release(slot)


class Carried:
    """The mixed steps the slot table runs, counted (each call still runs)."""

    def __init__(self, decoder) -> None:
        self.run, self.rows = decoder.mixed.step, []

    def __call__(self, position, rows, prefill, largest=None) -> bool:
        self.rows.append(len(rows))
        return self.run(position, rows, prefill, largest)


def test_takes_started_while_others_play_are_prefilled_in_mixed_steps(mixed, monkeypatch):
    decoder, table = mixed.decoder, mixed.slot_table
    decoder.prefix.clear()
    carried = Carried(decoder)
    monkeypatch.setattr(decoder.mixed, "step", carried)
    monkeypatch.setattr(table, "prefill_rows", 256)  # not what this CPU's playback allows: every step carries
    chunks_apart = []
    monkeypatch.setattr(decoder, "prefill_more", lambda *args, run=decoder.prefill_more, **kwargs:
                        chunks_apart.append(bool(table.decoding())) or run(*args, **kwargs))
    first, *later = prompts(mixed, 3)
    started = [table.start(first)]
    events: dict[int, list] = {}
    while len(events.get(started[0].slot, [])) < 2:  # the first take plays
        for take, new in table.step():
            events.setdefault(take.slot, []).extend(new)
    assert not carried.rows  # nothing waited beside it: plain steps
    started += [table.start(prompt) for prompt in later]
    while any(not take.done for take in started):
        for take, new in table.step():
            events.setdefault(take.slot, []).extend(new)
    assert carried.rows and min(carried.rows) >= 1  # their chunks rode in the playing takes' steps...
    assert True not in chunks_apart  # ...never run apart while a take decoded
    for take in started:
        done = events[take.slot][-1]
        assert isinstance(done, Done) and done.finish_reason in ("stop", "length") and done.codes.shape[1] > 0


def test_a_failed_mixed_step_ends_its_takes_and_the_carried_one_and_the_table_goes_on(mixed, monkeypatch):
    decoder, table = mixed.decoder, mixed.slot_table
    decoder.prefix.clear()
    monkeypatch.setattr(table, "prefill_rows", 256)
    first, second, third = prompts(mixed, 3)
    playing = table.start(first)
    while playing not in table.decoding():
        table.step()
    carried = table.start(second)
    run = decoder.mixed.step

    def failing(*args, **kwargs) -> bool:
        monkeypatch.setattr(decoder.mixed, "step", run)  # once
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(decoder.mixed, "step", failing)
    events = {id(take): [] for take in (playing, carried)}
    for take, new in table.step():
        events[id(take)] += new
    for take in (playing, carried):
        while not take.done:
            for other, new in table.step():
                events[id(other)] += new
        done = events[id(take)][-1]
        assert isinstance(done, Done) and done.finish_reason == "error" and "a kernel failed" in done.error
    assert table.free_slots == decoder.num_slots  # both slots back
    after = list(mixed.generate(third))[-1]  # the table goes on
    assert isinstance(after, Done) and after.finish_reason in ("stop", "length") and after.codes.shape[1] > 0


@torch.inference_mode()
def carry_third(decoder, prompts) -> int:
    """Two prompts decoding in slots 0 and 1 while mixed steps carry the third into slot 2 (the
    playing rows' logits finite at every step): the mixed steps it took."""
    first, second, third = prompts
    decoder.prefill(first, 0)
    decoder.prefill(second, 1)
    carried = decoder.begin_prefill(third, 2)
    steps, done = 0, False
    while not done:
        done = decoder.mixed.step(max(int(decoder.position[row]) for row in (0, 1)), [0, 1], carried)
        steps += 1
        assert all(row[0] == 1 for row in decoder.read_status()[:2])
    return steps


def carried_states(decoder, prompts) -> list[torch.Tensor]:
    """`carry_third`'s decoding rows' hidden states, then slot 2's state."""
    assert carry_third(decoder, prompts) == 2  # 256 rows, then the rest
    return [decoder.hidden[:2].clone(), *slot_state(decoder, 2, len(prompts[2].rows))]


def test_the_decoding_rows_of_a_mixed_step_run_the_layers_compiled_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the fast path compiles each layer's `mix` (fast.py `mix_of`), which the mixed
    step runs for its decoding rows: the same state as the eager halves, and one compile per
    kind of mixer (attention, DeltaNet), not per layer. Counted with `aot_eager` (test_compiles.py)."""
    from torch._dynamo.utils import counters

    from engine.bench.drama3.model import synthetic_prompt
    from engine.drama3.config import Drama3Config
    from engine.drama3.decoder import Decoder
    from engine.drama3.fast import MIXES, layer_compiled
    from engine.drama3.random_weights import random_model
    from engine.drama3.tiny import tiny_config

    monkeypatch.setattr(torch._dynamo.config, "force_parameter_static_shapes", False)  # as install_fast_path sets
    model = random_model(Drama3Config.from_dict(tiny_config()), "cpu", torch.float32).eval()
    prompts = [synthetic_prompt(model.config, rows, 16, seed) for seed, rows in enumerate((40, 60, 300))]
    eager = carried_states(Decoder(model, 1024, slots=3, mixed=True), prompts)
    torch._dynamo.reset()
    counters.clear()
    for layer in model.backbone.layers:
        monkeypatch.setitem(MIXES, layer, layer_compiled(layer.mix, False, backend="aot_eager"))
    compiled = carried_states(Decoder(model, 1024, slots=3, mixed=True), prompts)
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs == 2, graphs  # one symbolic compile per kind of mixer, for the 2 decoding rows
    for got, want in zip(compiled, eager, strict=True):
        close(got, want)


def test_a_warm_rides_no_step_while_a_take_awaits_its_first_audio(mixed, monkeypatch):
    decoder, table = mixed.decoder, mixed.slot_table
    decoder.prefix.clear()
    monkeypatch.setattr(table, "prefill_rows", 256)
    first, second = prompts(mixed, 2)
    playing = table.start(first)
    while playing not in table.decoding():
        table.step()
    warm = table.start(second, stop=len(second.rows))  # a prefill-only take: the next line's warm
    assert warm.prefill_only
    monkeypatch.setattr(playing, "playing_until", None)  # its first audio not out yet
    assert table.carried() == Carry([(warm, table.prefills[warm])], 0, 0)  # the warm waits
    monkeypatch.setattr(playing, "playing_until", time.perf_counter() + 1.0)  # a second of audio ahead
    carried = table.carried()
    assert carried is not None and carried.prompts[0][0] is warm and carried.rows == 256
    table.drop(warm)
    table.drop(playing)


@pytest.mark.parametrize("engine", ["mixed", "plain"])
def test_a_warm_yields_to_a_window_due_in_the_vocoder(engine, request, monkeypatch):
    """`warms_yield`: while the vocoder's queue holds a window whose client runs dry within two
    steps, a warm's chunk neither rides the step (mixed) nor runs beside it (plain); a window
    due in a minute holds nothing back, and without `warms_yield` nothing waits."""
    loaded = request.getfixturevalue(engine)
    decoder, table = loaded.decoder, loaded.slot_table
    decoder.prefix.clear()
    first, _, long = prompts(loaded, 3)  # the third: a history of two turns, several chunks
    playing = table.start(first)
    while playing not in table.decoding():
        table.step()
    monkeypatch.setattr(table, "prefill_rows", 16)  # a chunk a step (at least one runs)
    warm = table.start(long, stop=len(long.rows))
    assert len(table.prefills[warm].chunks) >= 3
    monkeypatch.setattr(playing, "playing_until", time.perf_counter() + 60.0)  # its first audio out
    monkeypatch.setattr(table, "warms_yield", True)
    window = Window(10, 20)  # the playing take's second window, waiting to be vocoded

    def queued(due_in_s: float) -> None:
        job = (np.zeros((1, 20), np.int64), window, None, None, time.perf_counter(), time.perf_counter() + due_in_s)
        monkeypatch.setattr(table.vocoder, "queue", [job])

    def warm_runs() -> bool:  # one step: did the warm's prefill move?
        left = list(table.prefills[warm].chunks)
        table.step()
        return warm not in table.prefills or list(table.prefills[warm].chunks) != left

    queued(0.0)  # due now
    if engine == "mixed":
        assert table.carried() == Carry([(warm, table.prefills[warm])], 0, 0)
    table.pace.report()
    assert not warm_runs()
    assert ", 1 held a warm back for the vocoder" in (table.pace.report() or "")  # the server's pace line
    queued(60.0)  # due in a minute: the warm goes on
    assert warm_runs()
    queued(0.0)
    monkeypatch.setattr(table, "warms_yield", False)
    assert warm_runs()
    monkeypatch.setattr(table.vocoder, "queue", [])
    table.drop(warm)
    table.drop(playing)

"""Takes decoding together (engine.start / engine.step) against the same takes alone, in
float32 on the CPU: a seeded take's frames and PCM are the same alone and batched, a slot
freed by a finished or cancelled take serves the next take as if fresh, and cancelling
one take, or one take failing, leaves the others intact."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

import engine.drama3.prefill as prefill_module
from drama3.poisoned_slot import poison
from engine import AudioWindow, Done, EngineSpec, HistoryTurn, RequestError, Sampling, load_engine
from engine.drama3.admission import HELD_S


@pytest.fixture(scope="module")
def single(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=1))


@pytest.fixture(scope="module")
def batched(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=3))


def checked(engine, events: list) -> tuple[np.ndarray, Done]:
    """A take's PCM and Done, after checking its stream: contiguous windows, one last window,
    every committed frame carried."""
    windows, done = events[:-1], events[-1]
    assert all(isinstance(w, AudioWindow) for w in windows) and isinstance(done, Done)
    assert [w.last for w in windows] == [False] * (len(windows) - 1) + [True]
    assert [w.start_sample for w in windows] == list(np.cumsum([0] + [len(w.pcm) for w in windows[:-1]]))
    assert sum(w.frames for w in windows) == done.timings["frames"] == done.codes.shape[1]
    pcm = np.concatenate([w.pcm for w in windows])
    assert len(pcm) == done.codes.shape[1] * engine.frame_samples
    return pcm, done


def alone(engine, prompt) -> tuple[np.ndarray, Done]:
    return checked(engine, list(engine.generate(prompt)))


def together(engine, plan: dict[int, list[tuple[str, object]]],
             cancel_at: dict[str, int] | None = None) -> tuple[dict[str, tuple[np.ndarray, Done]], dict[str, int]]:
    """Run takes in one engine: plan[k] lists (name, prompt) started before step k; a name in
    cancel_at is cancelled from that step on. Returns each take's (PCM, Done) and slot.

    The prompt rows per step are fixed for the run: the admission budget and the playback
    limit follow wall time (a loaded machine held a prompt back for steps and moved where
    a take's frames fell), and these tests are about what each step computes, not when."""
    cancel_at = cancel_at or {}
    names, events, slots, step = {}, {}, {}, 0

    def cancelled(name: str) -> Callable[[], bool]:
        return lambda: step >= cancel_at.get(name, 1 << 30)

    table = engine.slot_table
    rows, table.prefill_rows = table.prefill_rows, table.admission.start_rows
    try:
        while step <= max(plan) or engine.in_flight:
            for name, prompt in plan.get(step, []):
                take = engine.start(prompt, cancelled=cancelled(name))
                names[take], events[name], slots[name] = name, [], take.slot
            for take, new in engine.step():
                events[names[take]] += new
            step += 1
    finally:
        table.prefill_rows = rows
    return {name: checked(engine, got) for name, got in events.items()}, slots


def same(a: tuple[np.ndarray, Done], b: tuple[np.ndarray, Done]) -> bool:
    return np.array_equal(a[1].codes, b[1].codes) and np.array_equal(a[0], b[0]) \
        and a[1].finish_reason == b[1].finish_reason


@pytest.fixture(scope="module")
def prompts(single):
    history = torch.randint(0, 1024, (10, 30), generator=torch.Generator().manual_seed(1)).numpy()
    return {
        "a": single.prompt("Once more, with feeling.", None, [], Sampling(max_new_tokens=26, seed=5)),
        "b": single.prompt("Who left the lamp burning?", None, [HistoryTurn("Not me.", history)],
                           Sampling(max_new_tokens=36, seed=7)),
        "c": single.prompt("Then light it again.", None, [],
                           Sampling(temperature=0.7, top_k=12, top_p=0.8, max_new_tokens=22, seed=9)),
        "short": single.prompt("Cut.", None, [], Sampling(max_new_tokens=4, seed=2)),
    }


@pytest.fixture(scope="module")
def solo(single, prompts):
    """Every prompt's take alone, in a one-slot engine."""
    return {name: alone(single, prompt) for name, prompt in prompts.items()}


def test_a_seeded_take_is_the_same_alone_and_batched(batched, prompts, solo):
    # b starts first (slot 0); a joins four steps later, c five after that with other
    # sampling settings: three rows at three positions, each from its own generator.
    takes, slots = together(batched, {0: [("b", prompts["b"])], 4: [("a", prompts["a"])],
                                      9: [("c", prompts["c"])]})
    assert slots == {"b": 0, "a": 1, "c": 2}
    for name in ("a", "b", "c"):
        assert same(takes[name], solo[name]), name
        assert takes[name][1].codes.shape[1] > 10  # several windows each
    assert np.array_equal(alone(batched, prompts["a"])[1].codes, solo["a"][1].codes)  # alone in a batched engine too


def test_a_slot_freed_by_a_finished_take_is_reused(batched, prompts, solo):
    # "short" ends after 4 frames in slot 1 while b decodes in slot 0; a then takes the
    # lowest free slot, the one "short" left (its caches and DeltaNet state hold that take).
    takes, slots = together(batched, {0: [("b", prompts["b"]), ("short", prompts["short"])],
                                      8: [("a", prompts["a"])]})
    assert slots == {"b": 0, "short": 1, "a": 1}
    for name in ("b", "short", "a"):
        assert same(takes[name], solo[name]), name
    assert takes["short"][1].finish_reason == "length" and takes["short"][1].codes.shape[1] == 4


def test_cancelling_one_take_leaves_the_others_intact(batched, prompts, solo):
    # a (slot 1) is cancelled before step 6 while b and c decode; then a new take fills
    # the slot a freed and matches its solo run.
    takes, slots = together(batched, {0: [("b", prompts["b"]), ("a", prompts["a"]), ("c", prompts["c"])],
                                      10: [("again", prompts["a"])]}, cancel_at={"a": 6})
    assert slots == {"b": 0, "a": 1, "c": 2, "again": 1}
    cut = takes["a"][1]
    assert cut.finish_reason == "cancelled" and cut.codes.shape[1] <= 6
    assert np.array_equal(cut.codes, solo["a"][1].codes[:, :cut.codes.shape[1]])  # what it had was the solo take's
    for name in ("b", "c"):
        assert same(takes[name], solo[name]), name
    assert same(takes["again"], solo["a"])


def test_one_take_failing_leaves_the_others_intact(batched, prompts, solo, monkeypatch):
    # "huge" cannot fit the cache: its prefill fails and frees slot 1 at once. a then takes
    # slot 1, and from the 8th step on its row's logits are NaN: a ends as an error, b goes on.
    # An eager step computes only the stepping slots, in slot order: while b (slot 0) and a
    # (slot 1) both decode, row 1 is a's; once a has ended, b steps alone.
    original, steps = batched.model.candidate_logits, []

    def poisoned(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)  # [stepping slots, 4097]
        steps.append(len(steps))
        if len(steps) >= 8 and len(logits) > 1:
            logits[1] = math.nan
        return logits

    monkeypatch.setattr(batched.model, "candidate_logits", poisoned)
    for slot in range(batched.decoder.num_slots):  # no slot holds a's rows (prefix.py): a takes the lowest free one
        batched.decoder.forget(slot)
    huge = dataclasses.replace(prompts["short"], sampling=dataclasses.replace(prompts["short"].sampling,
                                                                              max_new_tokens=10**6))
    takes, slots = together(batched, {0: [("b", prompts["b"]), ("huge", huge)], 2: [("a", prompts["a"])]})
    assert slots == {"b": 0, "huge": 1, "a": 1}
    failed, poisoned_take = takes["huge"][1], takes["a"][1]
    assert failed.finish_reason == "error" and "does not fit" in failed.error and failed.codes.shape[1] == 0
    assert poisoned_take.finish_reason == "error" and "non-finite" in poisoned_take.error
    frames = poisoned_take.codes.shape[1]
    assert 0 < frames < 8 and np.array_equal(poisoned_take.codes, solo["a"][1].codes[:, :frames])
    assert same(takes["b"], solo["b"])
    prefix = batched.decoder.prefix
    assert prefix is not None and prefix.kept(prefix.plan(prompts["a"]), 1) == 0  # a failed slot's rows: not reused


def test_a_slot_left_non_finite_serves_the_next_take_as_a_fresh_slot(batched, single, prompts, solo):
    """Attention masks the rows past a query's position, but a masked row still enters the
    weighted sum with weight 0 (0 * NaN is NaN), and a take at position 0 starts its DeltaNet
    state from the slot's: one take that went non-finite made every later take in its slot
    fail at its first step (the H200 at 16 and 64 directors). The next take must be the take
    a fresh slot gives, prefilled from row 0, restored whole from the prefix cache, or
    resumed after a cached prefix."""
    history = torch.randint(0, 1024, (10, 30), generator=torch.Generator().manual_seed(1)).numpy()  # b's
    again = single.prompt("Then who did?", None, [HistoryTurn("Not me.", history)], Sampling(max_new_tokens=20, seed=3))
    prefix = batched.decoder.prefix
    assert prefix is not None
    prefix.clear()
    for what, prompt, want, counter in (("prefilled from row 0", prompts["a"], solo["a"], "misses"),
                                        ("restored whole", prompts["a"], solo["a"], "hits"),
                                        ("resumed after b's history", again, alone(single, again), "partial_hits")):
        if counter == "partial_hits":
            assert same(alone(batched, prompts["b"]), solo["b"])  # b's history into the cache
        poison(batched.model, 0)
        checks = batched.decoder.finite  # what a failed take's log line says (finite.py)
        assert checks.nonfinite(1, 4) == "" and checks.diagnose(0, 4).startswith("non-finite: ")
        assert "modules, first" in checks.diagnose(0, 4)
        batched.decoder.forget(0)  # as the slot table does when a take ends in error
        before = prefix.counters.as_dict()[counter]
        assert same(alone(batched, prompt), want), what
        assert prefix.counters.as_dict()[counter] == before + 1, what


def slot_caches(model, slot: int) -> list[torch.Tensor]:
    """Copies of every cache and state of one slot."""
    out = []
    for module in model.modules():
        if getattr(module, "kv_cache", None) is not None:
            out += [module.kv_cache.k[slot].clone(), module.kv_cache.v[slot].clone()]
        if getattr(module, "recurrent_state", None) is not None:
            out += [module.recurrent_state[slot].clone(), module.conv_state[slot].clone()]
    return out


@torch.inference_mode()
def test_an_inactive_row_is_held(batched, prompts):
    """A free slot's row computes in every step (a graph's fixed shapes) but keeps its inputs,
    so its position never moves towards the end of the cache, and writes only the scratch
    slot: its own caches (a prompt being prefilled into it, say) are untouched."""
    decoder = batched.decoder
    decoder.prefill(prompts["b"], 2)
    decoder.release(2)  # slot 2 keeps b's caches, now free
    decoder.prefill(prompts["a"], 1)
    held = decoder.hidden[[0, 2]].clone(), decoder.frame[[0, 2]].clone(), decoder.ras_window[[0, 2]].clone()
    caches = slot_caches(decoder.model, 2)
    start = len(prompts["a"].rows) - 1
    for k in range(3):
        decoder.advance(decoder.kv_len(start + k))  # every row, as a graph runs them
    assert decoder.position.tolist() == [0, start + 3, 0]
    assert decoder.slots.tolist() == [decoder.scratch, 1, decoder.scratch]
    for before, after in zip(held, (decoder.hidden[[0, 2]], decoder.frame[[0, 2]], decoder.ras_window[[0, 2]])):
        assert torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(caches, slot_caches(decoder.model, 2), strict=True))
    decoder.release(1)
    assert decoder.position.tolist() == [0, 0, 0] and not decoder.active.any()


def test_a_long_prompt_is_prefilled_between_the_steps_of_a_take_playing(batched, prompts, solo, single):
    """A take started while another decodes is prefilled a chunk per step (the other keeps
    decoding a frame each step meanwhile), and both takes are the ones they are alone."""
    history = torch.randint(0, 1024, (10, 1100), generator=torch.Generator().manual_seed(3)).numpy()
    long = batched.prompt("A long scene behind this line.", None, [HistoryTurn("Before.", history)],
                          Sampling(max_new_tokens=12, seed=8))
    assert len(long.rows) > 2 * prefill_module.EAGER_CHUNK_ROWS
    first = batched.start(prompts["b"])
    events: dict[object, list] = {first: [], "long": []}
    for _ in range(3):
        for take, new in batched.step():
            events[take] += new
    second = batched.start(long)
    events[second] = events.pop("long")
    playing, prefill_steps = first.steps, 0
    # A chunk per step (the rows of one): how far the measured budget and the playback limit
    # let the prefill go depends on this machine's speed (the next test covers the limit).
    batched.slot_table.prefill_rows = prefill_module.EAGER_CHUNK_ROWS
    try:
        while batched.slot_table.prefills:
            for take, new in batched.step():
                events[take] += new
            prefill_steps += 1
    finally:
        batched.slot_table.prefill_rows = None
    assert prefill_steps >= 2 and first.steps - playing >= 2  # chunks between frames, not one stall
    admission = batched.slot_table.admission  # the budget measured those steps (admission.py)
    assert admission.decode_s is not None and admission.row_s is not None
    while batched.in_flight:
        for take, new in batched.step():
            events[take] += new
    assert same(checked(batched, events[first]), solo["b"])
    assert same(checked(batched, events[second]), alone(single, long))


def test_a_prompt_waits_while_a_playing_take_would_run_out_of_audio(batched, prompts, solo, single):
    """The playback limit (admission.py): while a take's client is about to run out of audio
    before its next window, a new prompt's chunks wait; once it is ahead they run; both takes
    are the ones they are alone."""
    line = batched.prompt("Another line.", None, [], Sampling(max_new_tokens=10, seed=4))
    first = batched.start(prompts["b"])
    events: dict[object, list] = {first: []}
    while first.playing_until is None or first.windows.pending:  # its first audio out, none vocoding
        for take, new in batched.step():
            events[take] += new
    second = batched.start(line)
    events[second] = []
    chunks = list(batched.slot_table.prefills[second].chunks)
    first.playing_until = time.perf_counter() - 60.0  # its client played it all a minute ago
    # Steps alone outpace playback (1 ms), as on a GPU; this machine's own step time may not,
    # and there the limit stands aside (admission.py).
    batched.slot_table.admission.decode_s = 0.001
    steps = first.steps
    for take, new in batched.step():
        events[take] += new
    assert first.steps == steps + 1 and list(batched.slot_table.prefills[second].chunks) == chunks
    assert batched.slot_table.pace.held >= 1 and batched.slot_table.pace.window_s  # for the server's log (pace.py)
    # Held back HELD_S already: a few rows go in whatever the limit.
    second.started -= HELD_S
    first.playing_until = time.perf_counter() - 60.0
    batched.slot_table.admission.decode_s = 0.001
    for take, new in batched.step():
        events[take] += new
    assert second not in batched.slot_table.prefills or list(batched.slot_table.prefills[second].chunks) != chunks
    first.playing_until = time.perf_counter() + 3600.0  # an hour of audio ahead of its client
    while batched.slot_table.prefills:
        for take, new in batched.step():
            events[take] += new
    assert first.decoding  # the prompt went in while the first take still played
    while batched.in_flight:
        for take, new in batched.step():
            events[take] += new
    assert same(checked(batched, events[first]), solo["b"])
    assert same(checked(batched, events[second]), alone(single, line))


def test_slots_are_checked(batched, prompts, tiny_checkpoint):
    takes = [batched.start(prompts["a"]) for _ in range(3)]
    with pytest.raises(RuntimeError, match="slots are decoding"):
        batched.start(prompts["a"])
    with pytest.raises(RuntimeError, match="one take alone"):
        next(batched.generate(prompts["a"]))
    for take in takes:
        batched.drop(take)
    assert batched.free_slots == 3 and batched.in_flight == 0
    for slots in (0, 33, True):
        with pytest.raises(RequestError, match="slots must be a whole number from 1 to 32"):
            load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cpu", slots=slots))


def first_window_step(engine, prompt) -> tuple[int | None, int]:
    """Run one take through engine.start / engine.step (windows vocoded on the engine's worker
    thread): the take's decoded frames when its first audio was handed out, and in all."""
    take, first = engine.start(prompt), None
    while not take.done:
        for stepped, events in engine.step():
            if stepped is take and first is None and any(isinstance(e, AudioWindow) and len(e.pcm) for e in events):
                first = take.steps
    return first, take.steps


def test_the_first_window_is_handed_out_while_the_take_decodes(single):
    """The worker thread vocodes the first window while the loop decodes on, so it is handed
    out long before the take ends (on the GPU, test_decoder_gpu.py holds it to 3x the first
    window's frames, with every blocking read an error)."""
    first, frames = first_window_step(single, single.prompt("Heard while it decodes.", None, [],
                                                            Sampling(max_new_tokens=120, seed=0)))
    assert frames > 30  # long enough to tell (this seed's take ends at 68 frames)
    assert first is not None and first < frames // 2


def test_the_gpus_fp8_kernel_serves_64_slots_and_the_gathered_path_its_pairs(tiny_model):
    """On CUDA the FP8 experts' kernel has no pair limit: 64 slots (the row buckets' top);
    off it the gathered expert path keeps slots x experts per token within its pairs."""
    from engine.drama3.engine import MAX_SLOTS, most_slots
    from engine.drama3.moe import GATHER_MAX_PAIRS

    _, config, _ = tiny_model
    assert config.fp8_experts
    assert most_slots(config, torch.device("cuda")) == MAX_SLOTS == 64
    per_token = config.text.num_experts_per_tok
    assert most_slots(config, torch.device("cpu")) == GATHER_MAX_PAIRS // per_token
    dense = dataclasses.replace(config, fp8_experts=False)  # a checkpoint with bfloat16 experts
    assert most_slots(dense, torch.device("cuda")) == GATHER_MAX_PAIRS // per_token


@pytest.mark.gpu
def test_slots_are_sized_from_the_gpus_free_memory(tiny_model):
    """On the GPU: as many slots as the free memory holds caches for, at most 64, capped by
    --slots; the reason in words for the log."""
    from engine.drama3.engine import GPU_RESERVE, sized_slots
    from engine.drama3.model import cache_bytes

    _, config, _ = tiny_model
    device, rows = torch.device("cuda"), 8192 + 1200
    free, total = torch.cuda.mem_get_info(device)
    fits = int((free - GPU_RESERVE * total) // cache_bytes(config, rows, torch.bfloat16)) - 1
    slots, why = sized_slots(config, device, rows, torch.bfloat16, None)
    assert slots == min(64, fits) and "GiB free" in why and "at most 64" in why
    capped, why = sized_slots(config, device, rows, torch.bfloat16, 3)
    assert capped == 3 and "--slots 3" in why

"""On a GPU, where prefill groups are on: every group shape is captured as a CUDA graph, a
prompt prefilled in grouped graph replays leaves the state it leaves alone (to bfloat16
rounding), and takes started together all end well.

The state comparison runs the experts on their plain path (dequantised weights, bfloat16
activations; `w8a8 = False`, as test_fast_gpu.py and test_fuse.py do): on the served W8A8
path a GEMM blocked otherwise in a group moves an activation across a float8 rounding
boundary now and then (one e4m3 step is 6-12% of its element), which stop 42's H100 run
showed as a 14% largest difference in a state after a few layers; without float8 activations
what is left to compare is the grouping itself (padding, slots, positions, graphs)."""

from __future__ import annotations

import pytest
import torch

from engine import Done, EngineSpec, load_engine
from engine.drama3.moe import Experts

from .test_prefill_groups import Counted, prompts
from .test_prefix import slot_state

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu(tiny_checkpoint):
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cuda", slots=4))
    for module in engine.decoder.model.modules():
        if isinstance(module, Experts):
            module.w8a8 = False  # before the graphs are captured: they replay the path they saw
    engine.warm_up()  # captures the graphs
    return engine


@torch.inference_mode()
def test_groups_replay_as_graphs_and_leave_the_state_of_one_prompt_alone(gpu):
    decoder = gpu.decoder
    groups = decoder.groups
    assert groups.most > 1 and groups.graphs and all(g.graphs and not g.eager for g in groups.graphs.values())
    decoder.prefix.clear()
    takes = prompts(gpu)
    counted = Counted(decoder)
    decoder.prefill_group = counted  # (counted, each call still runs; put back below)
    try:
        decoder.prefill_together([decoder.begin_prefill(prompt, slot) for slot, prompt in enumerate(takes)])
    finally:
        del decoder.prefill_group
    assert max(counted.sizes) == len(takes)
    together = [slot_state(decoder, slot, len(prompt.rows)) for slot, prompt in enumerate(takes)]
    for slot in range(len(takes)):
        decoder.release(slot)
    decoder.prefix.clear()
    for prompt, got in zip(takes, together, strict=True):
        decoder.prefill(prompt, 0)
        want = slot_state(decoder, 0, len(prompt.rows))
        decoder.release(0)
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            error, scale = (a.double() - b.double()).abs().max(), b.double().abs().max()
            # bfloat16 rounding, through every layer; `index` in slot_state's order (KV rows, DeltaNet states, ...)
            assert error <= 5e-2 * scale + 1e-3, (index, a.shape, float(error), float(scale))


def test_takes_started_together_end_well(gpu):
    gpu.decoder.prefix.clear()
    table = gpu.slot_table
    started = [table.start(prompt) for prompt in prompts(gpu)]
    ended: dict[int, Done] = {}
    while any(not take.done for take in started):
        for take, events in table.step():
            ended.update((take.slot, event) for event in events if isinstance(event, Done))
    assert len(ended) == len(started)
    assert all(done.finish_reason in ("stop", "length") and done.codes.shape[1] > 0 for done in ended.values())

"""On a GPU, as served (bfloat16, fast path, prefill and step graphs): a take whose prefix
came from the prefix cache leaves the caches and states a prefill from row 0 leaves and
makes the same frames, for a retake (the whole prompt), the next line (a prefix), and
snapshots spilled to pinned host memory and copied back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import Done, EngineSpec, HistoryTurn, Sampling, load_engine
from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.layers import KVCache

pytestmark = pytest.mark.gpu

HISTORY = [HistoryTurn(f"Kept line {i}.", np.random.default_rng(i).integers(0, 1024, (10, 120 + 30 * i)))
           for i in range(3)]
SAMPLING = Sampling(max_new_tokens=16, seed=5)


@pytest.fixture(scope="module")
def gpu(tiny_checkpoint):
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cuda", prefix_cache_gib=1,
                                    prefix_cache_host_gib=1))
    engine.warm_up()
    return engine


def state(engine, prompt) -> list[torch.Tensor]:
    decoder, rows = engine.decoder, len(prompt.rows)
    decoder.prefill(prompt, 0)
    out: list[torch.Tensor] = []
    for module in decoder.model.modules():
        if isinstance(module, KVCache):
            out += [module.k[0, :rows].clone(), module.v[0, :rows].clone()]
        elif isinstance(module, GatedDeltaNet):
            out += [module.conv_state[0].clone(), module.recurrent_state[0].clone()]
    out.append(decoder.hidden[0].clone())
    decoder.release(0)
    torch.cuda.synchronize()
    return out


def codes(engine, prompt) -> np.ndarray:
    done = list(engine.generate(prompt))[-1]
    assert isinstance(done, Done) and done.error is None
    return done.codes


@torch.inference_mode()
def test_cached_prefixes_equal_a_prefill_from_row_zero_on_the_gpu(gpu):
    cache = gpu.decoder.prefix
    assert cache is not None and cache.budget > 0
    line = gpu.prompt("On the GPU, again.", None, HISTORY, SAMPLING)
    following = gpu.prompt("And the next.", None, HISTORY, SAMPLING)
    cache.clear()
    scratch_line, scratch_next = state(gpu, line), None
    cache.clear()
    scratch_next = state(gpu, following)
    cache.clear()
    first = codes(gpu, line)
    assert codes(gpu, line).tolist() == first.tolist()  # a retake from the whole-prompt snapshot
    for a, b in zip(state(gpu, line), scratch_line):
        assert torch.equal(a, b)
    for a, b in zip(state(gpu, following), scratch_next):  # the history's snapshot, then the new line
        assert torch.equal(a, b)
    assert cache.stats()["partial_hits"] >= 1

    # Spilled: every snapshot moves to pinned host memory, and is copied back on a hit.
    budget = cache.budget
    try:
        cache.budget = 0
        cache.fit()
        stats = cache.stats()
        assert stats["device_bytes"] == 0 and stats["host_bytes"] > 0 and stats["spills"] >= 1
        assert all(node.on_host and node.kv[0].is_pinned() for node in cache.nodes.values())
        cache.budget = budget
        for a, b in zip(state(gpu, line), scratch_line):
            assert torch.equal(a, b)
        assert codes(gpu, line).tolist() == first.tolist()
    finally:
        cache.budget = budget


def test_a_budget_past_the_free_memory_is_lowered_at_warm_up(tiny_checkpoint, caplog):
    """Snapshots past the free memory would fail the takes that record them: warm-up caps an
    asked budget at 90% of the memory free then, and says so."""
    engine = load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cuda", prefix_cache_gib=1e6, slots=1))
    warm = engine.warm_up()
    cache = engine.decoder.prefix
    assert cache is not None and 0 < cache.budget < torch.cuda.get_device_properties(engine.device).total_memory
    assert warm["prefix_cache_gib"] == round(cache.budget / 2**30, 2) < 1e6
    assert any("GiB asked for, but" in record.getMessage() for record in caplog.records)
    prompt = engine.prompt("Within the memory.", None, HISTORY, SAMPLING)
    assert codes(engine, prompt).tolist() == codes(engine, prompt).tolist()  # recorded, then restored
    assert cache.stats()["hits"] >= 1

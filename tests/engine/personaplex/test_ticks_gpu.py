"""On a GPU: the captured tick equals the eager tick (buckets, recycled and released slots, a ring that
wraps), batched equals single with sampled draws, the fused kernels follow the torch paths, the
released size captures and runs, and a closed engine gives its memory back."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.engine import Frame, PersonaPlex
from engine.personaplex.sampling import Sampling

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_float32")]  # tests/engine/conftest.py


def audio(ticks: int, slots: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.3, 0.3, (ticks, slots, 1920)).astype(np.float32)


def short_context(root: Path, slots: int, sampling: Sampling, **options: object) -> PersonaPlex:
    """The tiny checkpoint on CUDA with a context of 48 frames (it holds the tests' system prompts:
    a voice of 5 frames, 12 of silences, personas up to 19 tokens): 70 ticks wrap the ring."""
    from engine.personaplex.checkpoint import load_lm, load_mimi, load_tokenizer, read_config

    cfg = read_config(root)
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, context=48))
    dev = torch.device("cuda")
    temporal, depformer = load_lm(root, cfg, dev, torch.float32)  # float32: graph and eager agree to rounding
    return PersonaPlex.build(root, cfg, temporal, depformer, load_mimi(root, cfg, dev), load_tokenizer(root, cfg),
                             dev, slots, sampling, **options)  # type: ignore[arg-type]


def conversation(engine: PersonaPlex, ticks: int) -> list[list[Frame | None]]:
    """Slot 0 from the start, slot 5 from tick 10 to 30, slot 0 recycled at tick 40."""
    frames = []
    engine.start(0, persona="Hello", seed=3)
    for tick, pcm in enumerate(audio(ticks, engine.slots, seed=0)):
        if tick == 10:
            engine.start(5, persona="Your name is Jane.", voice="NATF2", seed=4)
        if tick == 30:
            engine.release(5)
        if tick == 40:
            engine.start(0, persona="Hi", seed=5)
        frames.append(engine.step(pcm))
    return frames


@torch.no_grad()
@pytest.mark.parametrize("kv", ["model", "float8"])
def test_captured_ticks_equal_eager_ticks(personaplex_checkpoint: Path, kv: str):
    runs = []
    for graphs in (True, False):
        engine = short_context(personaplex_checkpoint, 8, Sampling(seed=1), graphs=graphs, kv=kv)
        assert engine.ticks.graphed == graphs
        if graphs:  # every bucket captured, none left eager (graphs.py checks each for host reads)
            assert all(not g.eager and len(g.graphs) == 4 for g in engine.ticks.graphs.values())
            engine.reader = None  # prompts read in place as the eager engine's: the ticks are compared
        else:  # the reference: the tick's parts one after the other, no side stream for Mimi's encode
            engine.ticks.side = None
        runs.append(conversation(engine, 70))
        engine.close()
    spoken = 0
    for graphed, eager in zip(*runs):
        for a, b in zip(graphed, eager):
            assert (a is None) == (b is None)
            if a is not None:
                spoken += 1
                assert np.array_equal(a.tokens, b.tokens)
                np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-4)
    assert spoken > 80


@torch.no_grad()
def test_a_fork_that_cannot_be_captured_gives_sequential_graphs_not_eager_ticks(personaplex_checkpoint: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 caplog: pytest.LogCaptureFixture):
    from engine.personaplex.ticks import Ticks

    whole = Ticks.whole

    def unforkable(self: Ticks, n: int) -> None:
        if self.side is not None and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("operation not permitted when stream is capturing")
        whole(self, n)

    monkeypatch.setattr(Ticks, "whole", unforkable)
    engine = short_context(personaplex_checkpoint, 4, Sampling(seed=1))
    assert engine.ticks.side is None and "capturing it with the encode first" in caplog.text
    assert all(not g.eager and len(g.graphs) == 3 for g in engine.ticks.graphs.values())
    engine.start(0, persona="Hello", seed=3)
    frames = [engine.step(pcm)[0] for pcm in audio(8, 4, seed=0)]
    assert frames[-1] is not None and np.isfinite(frames[-1].pcm).all()
    engine.close()


@torch.no_grad()
@pytest.mark.parametrize("kv", ["model", "float8"])
def test_a_slot_left_out_of_a_captured_tick_keeps_its_place(personaplex_checkpoint: Path, kv: str):
    """test_slots.py's case on CUDA graphs, where the fused ring attention skips the held row."""
    from .test_slots import check_left_out

    check_left_out(lambda: short_context(personaplex_checkpoint, 2, Sampling(seed=3), kv=kv))


@torch.no_grad()
def test_a_seeded_conversation_draws_the_same_alone_and_in_a_batch(personaplex_checkpoint: Path):
    big = short_context(personaplex_checkpoint, 8, Sampling(seed=1))
    alone = short_context(personaplex_checkpoint, 1, Sampling(seed=1))
    big.start(2, persona="Hello", seed=11)
    big.start(6, persona="Your name is Jane.", seed=7)
    pcm = audio(40, 8, seed=1)
    batched = [big.step(a)[6] for a in pcm]
    alone.start(0, persona="Your name is Jane.", seed=7)
    # slot 6's prompt is read before big's second tick (slot 2's before its first) and it speaks from
    # that tick; alone reads it before its first tick: both hear pcm[1:] from their first frame on
    assert batched[0] is None and batched[1] is not None
    for a, b in zip(batched[1:], (alone.step(p[6])[0] for p in pcm[1:]), strict=True):
        assert a is not None and b is not None
        assert np.array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("graphs", [False, True])
def test_a_joining_prompt_is_read_without_cudnn_attention_or_eager_launches(personaplex_checkpoint: Path,
                                                                            graphs: bool):
    """A joining conversation's prompt chunk (its length new to the process): launched eagerly it
    runs no cuDNN SDPA, whose per-shape planning on the host held the others' tick (lockstep.py
    `prompt_attention`); with graphs it is replayed in the scratch row and copied into the slot
    (prompt_reader.py), no attention launched from the host. Either way the slot then talks."""
    from torch.profiler import ProfilerActivity, profile

    engine = short_context(personaplex_checkpoint, 2, Sampling(seed=1), graphs=graphs)
    assert (engine.reader is not None) == graphs
    engine.start(1, persona="You are a kind teacher.", seed=2)  # (the 48-frame context holds 19 tokens)
    quiet = np.zeros((2, engine.frame_size), dtype=np.float32)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        while engine.prefilling(1):
            engine.step(quiet, hearing=())
        torch.cuda.synchronize()
    names = {event.key for event in prof.key_averages()}
    assert not any("cudnn_attention" in name for name in names)
    assert ("aten::scaled_dot_product_attention" in names) != graphs  # replayed, not launched
    assert engine.step(quiet, hearing={1})[1] is not None


@torch.no_grad()
def test_the_fused_kernels_follow_the_torch_paths(personaplex_checkpoint: Path):
    """Helium's hidden states with the fused ring attention vs SDPA over the dequantised ring (float32 model)."""
    runs = []
    for fused in (True, False):
        engine = short_context(personaplex_checkpoint, 2, Sampling(greedy=True), fused=fused, kv="float8")
        temporal, cfg = engine.lockstep.temporal, engine.cfg.lm
        x = torch.randn(2, 40, cfg.dim, generator=torch.Generator().manual_seed(0)).cuda()
        temporal.setup_streams(2)
        runs.append(torch.cat([temporal(x[:, t:t + 1], torch.full((2, 1), t, device="cuda"))[0]
                               for t in range(40)], 1))
        engine.close()
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-4, atol=1e-4)
    from engine.kernels.fallback import failures

    assert failures() == {}  # the kernels ran, not their references in their place


@torch.no_grad()
def test_the_released_size_captures_runs_and_frees_its_memory():
    from engine.personaplex.random_weights import random_engine, random_parts

    parts = random_parts("released", torch.device("cuda"))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for slots in (2, 4):
        engine = random_engine(parts, slots, Sampling(seed=0))
        assert engine.ticks.graphed and all(not g.eager for g in engine.ticks.graphs.values())
        memory = engine.memory()
        assert 0.7 < memory["kv_gib_per_conversation"] < 0.8  # float8: 32 layers x 2 x 3,000 x 4,096 + scales
        engine.start(0, persona="You are a wise and friendly teacher.", voice="RANDOM", seed=1)
        for pcm in audio(6, slots, seed=2):
            frames = engine.step(pcm)
        assert frames[0] is not None and np.isfinite(frames[0].pcm).all()
        assert engine.timings["gpu_ms"] > 0 and engine.timings["bucket"] == 1
        engine.close()
        del engine, frames
        gc.collect()
        torch.cuda.empty_cache()
        assert torch.cuda.memory_allocated() - before < 64 * 2**20  # every ring, stream and graph given back


def test_an_engine_built_with_autograd_on_keeps_no_history(personaplex_checkpoint: Path):
    """Built outside any no_grad (as `retake serve --converse` and the bench build one): the prompt
    reader's captured chunks leave the rings without autograd history. Stop 42's H100: a released-size
    engine of one conversation held 59 GiB of saved activations from the reader's captures."""
    assert torch.is_grad_enabled()
    engine = short_context(personaplex_checkpoint, 2, Sampling(seed=0))
    assert engine.reader is not None and not engine.reader.chunks.eager  # captured, on CUDA
    engine.start(0, persona="Hello", seed=3)
    for pcm in audio(3, engine.slots, seed=0):
        engine.step(pcm)
    for ring in engine.lockstep.temporal.rings():
        for state in (ring.keys, ring.values, ring.key_scales, ring.value_scales):
            assert not state.requires_grad and state.grad_fn is None
    engine.close()

"""On a GPU: the Inductor-compiled tick paths (Helium's layers, the depformer's steps, Mimi's transformer
layers) against the eager modules. The tiny checkpoint in float32 gives the eager tick's frames through
captured ticks; the released depformer and two released-size Helium layers (random bf16 weights, float8
ring, fused ring attention) give the eager outputs within bf16 rounding, the released Mimi (float32) its
eager decode within float32 rounding, and each replays from a CUDA graph what it computed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.compiled_depformer import CompiledDepformer, compile_log
from engine.personaplex.compiled_mimi import CompiledMimiLayer
from engine.personaplex.compiled_temporal import CompiledTemporal
from engine.personaplex.engine import PersonaPlex
from engine.personaplex.sampling import Sampling

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_float32")]  # tests/engine/conftest.py


def tiny_engine(root: Path, compiled: bool) -> PersonaPlex:
    """The tiny checkpoint on CUDA in float32 with a context of 32 frames, CUDA graphs: the longest
    system prompt below is 24 frames (a 5-frame voice, 12 of silences, 7 persona tokens), and 40
    ticks past it wrap the ring."""
    from engine.personaplex.checkpoint import load_lm, load_mimi, load_tokenizer, read_config

    cfg = read_config(root)
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, context=32))
    dev = torch.device("cuda")
    temporal, depformer = load_lm(root, cfg, dev, torch.float32)
    return PersonaPlex.build(root, cfg, temporal, depformer, load_mimi(root, cfg, dev), load_tokenizer(root, cfg),
                             dev, 4, Sampling(seed=1), compiled=compiled)


@torch.no_grad()
def test_captured_ticks_with_the_compiled_depformer_give_the_eager_frames(personaplex_checkpoint: Path):
    runs = []
    for compiled in (True, False):
        engine = tiny_engine(personaplex_checkpoint, compiled)
        assert engine.ticks.graphed and all(not g.eager for g in engine.ticks.graphs.values())
        steps, helium = engine.lockstep.steps, engine.lockstep.helium
        assert isinstance(steps, CompiledDepformer) == compiled == isinstance(helium, CompiledTemporal)
        engine.start(0, persona="Hello", seed=3)
        engine.start(2, persona="Your name is Jane.", seed=4)
        rng = np.random.default_rng(0)
        frames = []
        for tick in range(40):
            if tick == 20:
                engine.start(3, persona="Hi", seed=5)  # a larger bucket from here on
            frames.append(engine.step(rng.uniform(-0.3, 0.3, (4, engine.frame_size)).astype(np.float32)))
        assert isinstance(engine.mimi_layer, CompiledMimiLayer) == compiled
        if isinstance(steps, CompiledDepformer) and isinstance(helium, CompiledTemporal):
            assert steps.failed is None and helium.failed is None  # they ran, not the eager fallback
            assert isinstance(engine.mimi_layer, CompiledMimiLayer) and engine.mimi_layer.failed is None
        runs.append(frames)
        engine.close()
    spoken = 0
    for ours, reference in zip(*runs):
        for a, b in zip(ours, reference):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                spoken += 1
                assert np.array_equal(a.tokens, b.tokens)
                np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-4)
    assert spoken > 40
    assert compile_log()  # and it was timed


@torch.no_grad()
def test_the_released_depformer_compiled_matches_eager_and_replays_in_a_graph():
    from engine.personaplex.config import PersonaPlexConfig
    from engine.personaplex.depformer import Depformer
    from engine.personaplex.random_weights import _randomize

    cfg = PersonaPlexConfig.from_dicts({}, None).lm
    generator = torch.Generator("cuda").manual_seed(0)
    with torch.device("meta"):
        depformer = Depformer(cfg)
    depformer.to_empty(device="cuda")
    depformer.to(torch.bfloat16)
    _randomize(depformer, generator)
    batch, steps = 8, cfg.codebooks
    g = torch.Generator("cuda").manual_seed(1)
    hidden = torch.randn(batch, 1, cfg.dim, device="cuda", generator=g).to(torch.bfloat16)
    text = torch.randint(0, cfg.text_card, (batch,), device="cuda", generator=g)
    targets = torch.randint(0, cfg.card, (batch, cfg.depformer_steps), device="cuda", generator=g)
    provided = torch.ones(batch, cfg.depformer_steps, dtype=torch.bool, device="cuda")  # teacher forcing: every
    # step's input is fixed, so a near-tie that one path breaks the other way does not change later steps

    def run(steps_fn: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits: list[torch.Tensor] = []

        def sample(step_logits: torch.Tensor, t: int) -> torch.Tensor:
            logits.append(step_logits.clone())
            return step_logits.argmax(-1)

        codes = steps_fn(hidden, text, targets, provided, sample, steps=steps)  # type: ignore[operator]
        return codes, logits

    depformer.setup_streams(batch)
    _, reference_logits = run(depformer)
    compiled = CompiledDepformer(depformer)
    ours, our_logits = run(compiled)  # compiles
    assert compiled.failed is None
    assert len(our_logits) == steps
    for a, b in zip(our_logits, reference_logits):
        scale = b.abs().max()
        assert (a - b).abs().max() < 0.05 * scale  # bf16: fused vs eager rounding

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(compiled)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    captured: list[torch.Tensor] = []
    with torch.cuda.graph(graph):
        captured.append(run(compiled)[0])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], ours)  # the replay computes what the compiled call did


@torch.no_grad()
def test_released_size_helium_layers_compiled_match_eager_and_replay_in_a_graph():
    from engine.personaplex.config import PersonaPlexConfig
    from engine.personaplex.engine import configure_rings
    from engine.personaplex.random_weights import _randomize
    from engine.personaplex.temporal import Temporal

    cfg = dataclasses.replace(PersonaPlexConfig.from_dicts({}, None).lm, num_layers=2)  # two layers: the maths
    with torch.device("meta"):
        temporal = Temporal(cfg)
    temporal.to_empty(device="cuda")
    temporal.to(torch.bfloat16)
    _randomize(temporal, torch.Generator("cuda").manual_seed(0))
    configure_rings(temporal, "float8", True, torch.device("cuda"))
    batch = 4
    g = torch.Generator("cuda").manual_seed(1)
    xs = torch.randn(12, batch, 1, cfg.dim, device="cuda", generator=g).to(torch.bfloat16)

    def ticks(helium: object) -> list[torch.Tensor]:
        temporal.setup_streams(batch)  # a fresh ring
        hidden = []
        for t, x in enumerate(xs):
            positions = torch.tensor([[t], [t + 3], [t], [t + 3000]], device="cuda")  # the last slot wraps
            hidden.append(helium(x, positions, slice(0, batch))[0])  # type: ignore[operator]
        return hidden

    reference = ticks(temporal)
    compiled = CompiledTemporal(temporal)
    ours = ticks(compiled)
    assert compiled.failed is None
    for a, b in zip(ours, reference):
        assert (a.float() - b.float()).abs().max() < 0.05 * b.float().abs().max()  # bf16 rounding, not maths

    x, positions = xs[0], torch.tensor([[20]] * batch, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        expected = compiled(x, positions, slice(0, batch))[0].clone()  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = compiled(x, positions, slice(0, batch))[0]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, expected)  # the same position again: the same ring, the same output


@torch.no_grad()
def test_the_released_mimi_compiled_decodes_as_eager_and_replays_in_a_graph():
    from engine.personaplex.config import PersonaPlexConfig
    from engine.personaplex.mimi import LayerFn, Mimi, run_layer
    from engine.personaplex.random_weights import _randomize

    cfg = PersonaPlexConfig.from_dicts({}, None)
    with torch.device("meta"):
        mimi = Mimi(cfg.mimi, cfg.lm.codebooks)
    mimi.to_empty(device="cuda")
    _randomize(mimi, torch.Generator("cuda").manual_seed(0))
    batch = 4
    g = torch.Generator("cuda").manual_seed(1)
    codes = torch.randint(0, cfg.mimi.bins, (10, batch, mimi.codebooks), device="cuda", generator=g)
    pcm = torch.rand(10, batch, mimi.frame_size, device="cuda", generator=g) - 0.5

    def ticks(layer: LayerFn) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        mimi.setup_streams(batch)
        encoded = [mimi.encode(x, layer) for x in pcm]
        return encoded, [mimi.decode(c, layer) for c in codes]

    _, reference = ticks(run_layer)  # the eager layers
    layer = CompiledMimiLayer()
    encoded, ours = ticks(layer)
    assert layer.failed is None and all(c.shape == (batch, mimi.codebooks) for c in encoded)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # float32, fused vs eager

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    state = [t.clone() for t in mimi.buffers()]
    with torch.cuda.stream(stream):
        expected = mimi.decode(codes[0], layer).clone()  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = mimi.decode(codes[0], layer)
    for buffer, saved in zip(mimi.buffers(), state):  # the streams as they were before the warm-up
        buffer.copy_(saved)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, expected)

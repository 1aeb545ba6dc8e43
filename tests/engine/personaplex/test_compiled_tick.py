"""The compiled tick paths against the eager modules on the CPU, float32: the depformer
(compiled_depformer.py: the same codes, teacher forcing included, 8 and all 16 steps, logits within
1e-5), Helium's layers (compiled_temporal.py: hidden states and text logits within 1e-5 over ticks that
wrap a float8 or a full-precision ring), Mimi's transformer layers (compiled_mimi.py: the same codes
and audio within 1e-5 over ticks that wrap Mimi's rings), a whole seeded conversation with the same
frames, a compile that fails giving way to the eager module, and the bench's side-by-side table.

Dynamo traces here with the `aot_eager` backend (the graph Inductor would get, functionalised, with its
key/value writes, run by torch): Inductor's own CPU compile takes a minute on a loaded 2-core machine.
Inductor on CUDA is test_compiled_depformer_gpu.py's (`pytest -m gpu`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.checkpoint import load_lm, load_mimi, read_config
from engine.personaplex.compiled_depformer import CompiledDepformer
from engine.personaplex.compiled_mimi import CompiledMimiLayer
from engine.personaplex.compiled_temporal import CompiledTemporal
from engine.personaplex.depformer import Depformer
from engine.personaplex.engine import PersonaPlex
from engine.personaplex.sampling import Sampling

BACKEND = "aot_eager"


def inputs(depformer: Depformer, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    """hidden [B, 1, dim], text [B], targets and provided [B, steps] (a third of the targets provided)."""
    g = torch.Generator().manual_seed(seed)
    dim = depformer.depformer_in[0].in_features
    card = depformer.linears[0].out_features
    hidden = torch.randn(batch, 1, dim, generator=g)
    text = torch.randint(0, depformer.depformer_text_emb.num_embeddings - 1, (batch,), generator=g)
    targets = torch.randint(0, card, (batch, depformer.steps), generator=g)
    provided = torch.rand(batch, depformer.steps, generator=g) < 0.3
    return hidden, text, targets, provided


def run(steps_fn: object, depformer: Depformer, batch: int, seed: int, steps: int) -> tuple[torch.Tensor, list]:
    """Codes [B, steps] and each step's logits, drawing with temperature from a seeded generator."""
    depformer.setup_streams(batch)  # stale keys from another frame: the mask must hide them
    logits: list[torch.Tensor] = []
    g = torch.Generator().manual_seed(seed + 1)

    def sample(step_logits: torch.Tensor, t: int) -> torch.Tensor:
        logits.append(step_logits.clone())
        return torch.multinomial(torch.softmax(step_logits, -1), 1, generator=g)[:, 0]

    codes = steps_fn(*inputs(depformer, batch, seed), sample, steps=steps)  # type: ignore[operator]
    return codes, logits


@pytest.fixture(scope="module")
def depformer(personaplex_checkpoint: Path) -> Depformer:
    cfg = read_config(personaplex_checkpoint)
    return load_lm(personaplex_checkpoint, cfg, torch.device("cpu"), torch.float32)[1]


@torch.no_grad()
@pytest.mark.parametrize("steps", [8, 16])
def test_the_compiled_steps_draw_the_codes_of_the_eager_ones(depformer: Depformer, steps: int):
    compiled = CompiledDepformer(depformer, BACKEND)
    for batch in (1, 3, 5):  # batch 1 and a dynamic batch
        reference, reference_logits = run(depformer, depformer, batch, seed=batch, steps=steps)
        ours, our_logits = run(compiled, depformer, batch, seed=batch, steps=steps)
        assert compiled.failed is None
        assert torch.equal(ours, reference)
        assert len(our_logits) == steps
        for a, b in zip(our_logits, reference_logits):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("kv", ["model", "float8"])
def test_compiled_helium_layers_follow_the_eager_module_as_the_ring_wraps(personaplex_checkpoint: Path, kv: str):
    import dataclasses

    from engine.personaplex.engine import configure_rings

    cfg = read_config(personaplex_checkpoint)
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, context=6))  # 20 ticks wrap the ring 3 times
    runs = []
    for compiled in (False, True):
        temporal = load_lm(personaplex_checkpoint, cfg, torch.device("cpu"), torch.float32)[0]
        configure_rings(temporal, kv, False, torch.device("cpu"))
        temporal.setup_streams(3)
        helium = CompiledTemporal(temporal, BACKEND) if compiled else temporal
        g = torch.Generator().manual_seed(0)
        outputs = []
        for t in range(20):
            x = torch.randn(3, 1, cfg.lm.dim, generator=g)
            positions = torch.tensor([[t], [t - 2], [t + 5]])  # each slot at its own position (one still at -1)
            outputs.append(helium(x, positions, slice(0, 3)))
        if isinstance(helium, CompiledTemporal):
            assert helium.failed is None
        runs.append(outputs)
    assert runs[0][0][0].shape == runs[1][0][0].shape == (3, 1, cfg.lm.dim)
    for (hidden, logits), (our_hidden, our_logits) in zip(*runs):
        torch.testing.assert_close(our_hidden, hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(our_logits, logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_compiled_mimi_layers_encode_and_decode_as_the_eager_ones_as_the_rings_wrap(personaplex_checkpoint: Path):
    cfg = read_config(personaplex_checkpoint)
    assert 2 * 12 > 2 * cfg.mimi.context  # 12 ticks of 2 positions wrap Mimi's rings more than twice
    runs = []
    for layer in (None, CompiledMimiLayer(BACKEND)):
        mimi = load_mimi(personaplex_checkpoint, cfg, torch.device("cpu"))
        outputs = []
        for batch in (1, 3):  # batch 1 and a dynamic batch
            mimi.setup_streams(batch)
            g = torch.Generator().manual_seed(batch)
            for _ in range(12):
                pcm = (torch.rand(batch, mimi.frame_size, generator=g) - 0.5) * 0.6
                codes = mimi.encode(pcm) if layer is None else mimi.encode(pcm, layer)
                agent = torch.randint(0, cfg.mimi.bins, (batch, mimi.codebooks), generator=g)
                outputs.append((codes, mimi.decode(agent) if layer is None else mimi.decode(agent, layer)))
        if layer is not None:
            assert layer.failed is None
        runs.append(outputs)
    for (codes, pcm), (our_codes, our_pcm) in zip(*runs):
        assert torch.equal(our_codes, codes)
        torch.testing.assert_close(our_pcm, pcm, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_failed_compile_gives_way_to_the_eager_modules(depformer: Depformer, personaplex_checkpoint: Path):
    def broken(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        raise RuntimeError("no compiler here")

    compiled = CompiledDepformer(depformer, broken)
    reference, _ = run(depformer, depformer, 2, seed=9, steps=8)
    ours, _ = run(compiled, depformer, 2, seed=9, steps=8)
    assert compiled.failed is not None and "no compiler here" in compiled.failed
    assert torch.equal(ours, reference)

    temporal = load_lm(personaplex_checkpoint, read_config(personaplex_checkpoint), torch.device("cpu"),
                       torch.float32)[0]
    temporal.setup_streams(2)
    x, positions = torch.randn(2, 1, temporal.cfg.dim), torch.tensor([[0], [3]])
    helium = CompiledTemporal(temporal, broken)
    hidden, logits = helium(x, positions, slice(0, 2))
    assert helium.failed is not None and "no compiler here" in helium.failed
    reference_hidden, reference_logits = temporal(x, positions, slice(0, 2))
    assert torch.equal(hidden, reference_hidden) and torch.equal(logits, reference_logits)

    mimi = load_mimi(personaplex_checkpoint, read_config(personaplex_checkpoint), torch.device("cpu"))
    layer, pcm = CompiledMimiLayer(broken), torch.rand(2, mimi.frame_size) - 0.5
    mimi.setup_streams(2)
    codes = mimi.encode(pcm, layer)
    assert layer.failed is not None and "no compiler here" in layer.failed
    mimi.setup_streams(2)
    assert torch.equal(codes, mimi.encode(pcm))


@torch.no_grad()
def test_a_seeded_conversation_with_the_compiled_depformer_equals_the_eager_one(personaplex_checkpoint: Path):
    frames = []
    for compiled in (False, True):
        engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=Sampling(seed=5),
                                  compiled=compiled)
        assert isinstance(engine.lockstep.steps, CompiledDepformer) == compiled
        if compiled:
            engine.lockstep.steps = CompiledDepformer(engine.lockstep.depformer, BACKEND)
            assert isinstance(engine.lockstep.helium, CompiledTemporal)
            engine.lockstep.helium = CompiledTemporal(engine.lockstep.temporal, BACKEND)
            assert isinstance(engine.mimi_layer, CompiledMimiLayer) and engine.ticks.layer is engine.mimi_layer
            engine.mimi_layer = engine.ticks.layer = CompiledMimiLayer(BACKEND)
        engine.start(0, persona="Hello", seed=3)
        engine.start(1, persona="Your name is Jane.", seed=4)
        rng = np.random.default_rng(0)
        frames.append([engine.step(rng.uniform(-0.3, 0.3, (2, engine.frame_size)).astype(np.float32))
                       for _ in range(12)])
        if compiled:
            assert engine.lockstep.steps.failed is None and engine.lockstep.helium.failed is None
            assert isinstance(engine.mimi_layer, CompiledMimiLayer) and engine.mimi_layer.failed is None
    spoken = 0
    for ours, reference in zip(frames[1], frames[0]):
        for a, b in zip(ours, reference):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                spoken += 1
                assert np.array_equal(a.tokens, b.tokens)
                np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-5)
    assert spoken > 0


def test_the_bench_compares_the_parts_with_either_tick(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """One slot count, the compiled tick (Inductor's CPU compiles: the slow part of this test) beside the
    eager one; the report carries both rows, their ratio and the compiles' seconds."""
    import json

    from backend.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "personaplex", "--slots", "1", "--ticks", "2", "--warmup", "1", "--greedy", "--compare",
                 "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "compiled vs eager tick" in printed and "compiles:" in printed
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["tick"] == "eager" and row["setup_s"] >= 0  # auto: eager on a CPU
    compare = row["compare"]
    assert compare["compiled"]["tick"] == "compiled" and compare["eager"]["tick"] == "eager"
    for part in ("encode", "model", "decode"):
        assert compare["compiled"][f"{part}_ms_mean"] > 0 and compare["eager"][f"{part}_ms_mean"] > 0
    for part in ("encode", "model", "decode"):
        ratio = compare["eager"][f"{part}_ms_mean"] / compare["compiled"][f"{part}_ms_mean"]
        assert row[f"{part}_ratio"] == round(ratio, 2)
    assert report["compile_s"] and all(s > 0 for s in report["compile_s"])

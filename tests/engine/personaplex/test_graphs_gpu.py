"""On a GPU: the CUDA-graphed tick (lockstep model step, Mimi encode and decode) equals the eager one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.engine import PersonaPlex
from engine.personaplex.sampling import Sampling

pytestmark = pytest.mark.gpu


@torch.no_grad()
def test_graphed_ticks_equal_eager_ticks_through_a_recycle(personaplex_checkpoint: Path):
    runs = []
    for graphs in (True, False):
        engine = PersonaPlex.load(personaplex_checkpoint, device="cuda", slots=2, sampling=Sampling(greedy=True),
                                  graphs=graphs)
        engine.open(persona="Hello")
        rng = np.random.default_rng(0)
        frames = []
        for tick in range(40):
            if tick == 10:
                engine.start(1, persona="Your name is Jane.")
            frames.append(engine.step(rng.uniform(-0.3, 0.3, (2, engine.frame_size)).astype(np.float32)))
        assert engine.lockstep.graphs.graphs if graphs else not engine.lockstep.graphs.graphs
        runs.append(frames)
    spoken = 0
    for graphed, eager in zip(*runs):
        for a, b in zip(graphed, eager):
            assert (a is None) == (b is None)
            if a is not None:
                spoken += 1
                assert np.array_equal(a.tokens, b.tokens)
                np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-5)
    assert spoken > 45  # slot 0 every tick, slot 1 once its system prompt is done

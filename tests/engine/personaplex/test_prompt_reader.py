"""A system prompt read through the scratch ring row (prompt_reader.py: on CUDA by graphs, here
eagerly) leaves the slot's rings as reading it in place does, whatever the scratch row held
before, and with a chunk shorter than its padded length."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.personaplex.engine import PersonaPlex
from engine.personaplex.lockstep import Lockstep
from engine.personaplex.prompt import plan
from engine.personaplex.prompt_reader import CHUNK_LENGTHS, PromptReader


@torch.no_grad()
def test_a_prompt_read_in_the_scratch_row_and_copied_equals_one_read_in_place(personaplex_checkpoint: Path) -> None:
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=3)
    assert engine.reader is None and engine.lockstep.scratch is None  # a CPU reads prompts in place
    cfg = engine.cfg.lm
    first = plan(cfg, engine.programme("You are a test.", engine.voice()))
    second = plan(cfg, engine.programme("Your name is Jane and you sell lamps.", engine.voice()))
    lockstep = Lockstep(cfg, engine.lockstep.temporal, engine.lockstep.depformer, 3, engine.device, scratch=True)
    reader = PromptReader(lockstep, graphs=False)
    rings = lockstep.temporal.rings()
    assert lockstep.scratch == 3 and all(ring.keys.shape[0] == 4 for ring in rings)
    chunk = max(CHUNK_LENGTHS)
    for planned in (first, second):  # the second over what the first left in the scratch row
        positions = planned.positions
        assert positions % chunk not in CHUNK_LENGTHS  # its last chunk runs padded
        for start in range(0, positions, chunk):
            lockstep.prefill(slice(0, 1), planned, start, min(start + chunk, positions))  # in place, slot 0
            reader.read(planned, start, min(start + chunk, positions))
        reader.copy_to(2)
        for ring in rings:
            for state in (ring.keys, ring.values):
                torch.testing.assert_close(state[2, :, :positions], state[0, :, :positions], rtol=1e-5, atol=1e-6)
        assert not torch.equal(rings[0].keys[1], rings[0].keys[2])  # slot 1, never read into, is untouched


def test_reading_keeps_no_autograd_history(personaplex_checkpoint: Path) -> None:
    """Called without a no_grad of the caller's (the reader's graphs are captured at an engine's
    build), a read prompt leaves the rings free of autograd: the weights require gradients, so a
    chunk run with them on made the rings' in-place writes keep every layer's saved activations
    alive, chained from chunk to chunk. On the H100 (stop 42) a one-conversation engine at the
    released size held 59 GiB of them after capturing the reader's four chunk graphs."""
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2)
    modules = (engine.lockstep.temporal, engine.lockstep.depformer, engine.mimi)
    assert not any(p.requires_grad for module in modules for p in module.parameters())  # the engine froze them
    cfg = engine.cfg.lm
    planned = plan(cfg, engine.programme("You are a test.", engine.voice()))
    engine.lockstep.temporal.requires_grad_(True)  # (as modules built elsewhere are: the reader must not care)
    lockstep = Lockstep(cfg, engine.lockstep.temporal, engine.lockstep.depformer, 2, engine.device, scratch=True)
    reader = PromptReader(lockstep, graphs=False)
    reader.capture()  # (graphs off: nothing captured, as on a CPU)
    reader.read(planned, 0, min(max(CHUNK_LENGTHS), planned.positions))
    reader.copy_to(1)
    for ring in lockstep.temporal.rings():
        for state in (ring.keys, ring.values, ring.key_scales, ring.value_scales):
            assert not state.requires_grad and state.grad_fn is None

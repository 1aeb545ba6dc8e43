"""The lockstep tick: the active slots advance one 80 ms frame together through Helium and the depformer.

    lockstep.reset(rows)                  # bool [B]: these slots start fresh streams
    lockstep.prefill(slice(s, s + 1), plan, 0, 64)   # a system prompt, a chunk of positions
    lockstep.finish(slice(s, s + 1), plan)           # ... whose staging ring the slot takes
    lockstep.tick(user_codes, n)          # the first n slots; the frame lands in `tokens[:n]`

A tick of slot b at its local step L (staging.py has the token bookkeeping):
1. the user's codes go to the staging ring, the warm-up rows get their initial tokens;
2. the model input is the ring's column of step L - 1, embedded, through Helium at
   position L - 1; the text token is drawn, then the depformer draws the agent's
   codebooks, teacher-forced where the target column is provided;
3. the samples go to the ring; the de-delayed frame of the step goes to `tokens`.

Design choices:
- A tick is `think` (gate, read, the model) then `settle` (the user's codes written, the
  warm-up gated again, commit, frame): the model reads column L - 1 and no sample of the
  user rows is kept, so it needs none of this tick's user codes and Mimi can encode them
  meanwhile (ticks.py); the ring ends as staging.py's order leaves it.
- A tick is a function of static device buffers only (the ring, the steps, `active`, the
  sampling rows, the user codes): no host value, no branch on a phase, no host sync, so
  the engine captures the whole tick (with Mimi) as one CUDA graph per batch bucket.
  `active` [B] says which slots advance; the others (free, or waiting while their system
  prompt is read) keep their staging ring and step. A waiting slot's query writes a key at
  its next position, which that position's real write replaces before anything reads it
  (ring.py), so it needs no mask in the model.
- Slot positions are Helium's key/value positions (step - 1). A slot whose streams are
  reset restarts at step 0, position -1: its first tick's key is never seen again, so a
  recycled slot runs exactly the positions of a fresh stream (the cold start of the
  reference), without touching the other slots.
- A system prompt forces every stream, so it is read as chunks of many positions
  (`prefill`: Helium only, no text head, no depformer, no sampling) from its plan
  (prompt.py), between ticks, and the slot then takes the planned staging ring (`finish`).
  On CUDA its attention avoids cuDNN's SDPA (`prompt_attention`): a chunk's length changes
  with every persona, and cuDNN plans each new shape on the host.
- The depformer runs the agent's 8 steps only. Its steps 8..15 predict the user codebooks,
  whose targets are always provided (user codes are written before every tick, and the
  warm-up gate covers a fresh slot), and the depformer is causal over steps, so skipping
  them changes no agent code: the reference's own inference (reference/personaplex.md
  §1.4), checked against `all_steps=True` by tests/engine/personaplex/test_slots.py. It
  halves the depformer's work.
- On CUDA (`compiled=True`) a tick's Helium layers and depformer steps run their small ops
  through functions compiled by Inductor (compiled_temporal.py, compiled_depformer.py:
  fused kernels, the same maths); the eager modules are the reference and the CPU's path.
- Draws are counter-based (sampling.py): keyed by the slot's seed and its step, so a slot's
  tokens do not depend on which other slots share the batch.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import engine.personaplex.staging as staging
from engine.personaplex.compiled_depformer import CompiledDepformer
from engine.personaplex.compiled_temporal import CompiledTemporal
from engine.personaplex.config import LMConfig
from engine.personaplex.depformer import Depformer
from engine.personaplex.prompt import Plan, initial_tokens
from engine.personaplex.sampling import SamplingRows
from engine.personaplex.temporal import Temporal
from engine.readback import to_device


def voice_runs(embeddings: list[torch.Tensor | None]) -> list[tuple[int, int]]:
    """[first, last) of each run of consecutive positions that carry a voice embedding."""
    runs: list[tuple[int, int]] = []
    for i, embedding in enumerate(embeddings):
        if embedding is None:
            continue
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def prompt_attention(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On CUDA, a prompt chunk's attention (many queries, a masked ring) without cuDNN's SDPA: each
    new chunk length made cuDNN build a plan on the host, 2.3 ms a layer, ~70 ms of a joining
    conversation's 256-position chunk (H100 profile, stop 36) while the others' tick waited.
    Memory-efficient attention takes the mask as it is; the CPU keeps its own kernel."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class Lockstep:
    def __init__(self, cfg: LMConfig, temporal: Temporal, depformer: Depformer, slots: int, device: torch.device,
                 all_steps: bool = False, compiled: bool = False, scratch: bool = False):
        self.cfg = cfg
        self.all_steps = all_steps
        self.temporal = temporal
        self.depformer = depformer
        # what a tick runs: the modules, or their compiled tick paths
        self.helium: Temporal | CompiledTemporal = CompiledTemporal(temporal) if compiled else temporal
        self.steps: Depformer | CompiledDepformer = CompiledDepformer(depformer) if compiled else depformer
        self.slots = slots
        self.device = device
        K, CT, n = cfg.rows, cfg.ring_columns, cfg.codebooks
        self.initial = initial_tokens(cfg).to(device)  # [K]
        self.delays = torch.tensor(cfg.delays, device=device)  # [K]
        self.user_rows = torch.arange(K, device=device) >= 1 + n  # [K]: the rows written from outside
        self.ring = self.initial[None, :, None].repeat(slots, 1, CT)  # [B, K, CT]
        self.provided = torch.zeros(slots, K, CT, dtype=torch.bool, device=device)
        self.local = torch.zeros(slots, dtype=torch.long, device=device)  # each slot's step
        self.active = torch.zeros(slots, dtype=torch.bool, device=device)  # the slots that advance
        self.tokens = torch.zeros(slots, K, dtype=torch.long, device=device)  # the last tick's frames
        self.sampling = SamplingRows(slots, device)
        # `scratch`: Helium's rings get one row past the slots, where prompt_reader.py reads prompts
        self.scratch = slots if scratch else None
        temporal.setup_streams(slots + scratch)
        depformer.setup_streams(slots)

    def reset(self, rows: torch.Tensor) -> None:
        """The slots marked in `rows` (bool [B]) start fresh streams at their next tick; the others are
        unaffected. Helium's ring needs nothing: the slot's positions restart at -1 (ring.py)."""
        rows = rows.to(self.device, torch.bool)
        self.ring.copy_(torch.where(rows[:, None, None], self.initial[:, None], self.ring))
        self.provided.masked_fill_(rows[:, None, None], False)
        self.local.masked_fill_(rows, 0)

    def tick(self, user: torch.Tensor, n: int) -> None:
        """One tick of the first n slots from the user's codes [n, codebooks] (device only, capturable)."""
        self.settle(user, self.think(n), n)

    def think(self, n: int) -> torch.Tensor:
        """A tick's model step, which needs none of this tick's user codes: they go to column L + delay
        (staging.py), the model reads column L - 1, and the target column's user rows are provided,
        so no sample of them is kept. So Mimi can encode the user's frame meanwhile (ticks.py). The
        samples [n, K] (their user rows unused)."""
        ring, provided, local, active = self.ring[:n], self.provided[:n], self.local[:n], self.active[:n]
        staging.gate(ring, provided, local, self.delays, self.initial, active)  # (again in settle, after the write)
        inputs, goal, goal_provided = staging.read(ring, provided, local)
        return self._model(inputs, goal, goal_provided, local, n)

    def settle(self, user: torch.Tensor, sampled: torch.Tensor, n: int) -> None:
        """The rest of the tick, in staging.py's order: the user's codes [n, codebooks] written, the
        warm-up gated, the samples committed, the frame out."""
        cfg = self.cfg
        ring, provided, local, active = self.ring[:n], self.provided[:n], self.local[:n], self.active[:n]
        values = torch.cat([self.initial[None, :1 + cfg.codebooks].expand(n, -1), user], dim=1)  # [n, K]
        staging.write(ring, provided, local, self.delays, values, self.user_rows[None] & active[:, None])
        staging.gate(ring, provided, local, self.delays, self.initial, active)
        staging.commit(ring, provided, local, sampled, active)
        self.tokens[:n] = staging.frame(ring, local, self.delays, cfg.max_delay)

    def _model(self, inputs: torch.Tensor, goal: torch.Tensor, provided: torch.Tensor, local: torch.Tensor,
               n: int) -> torch.Tensor:
        """Embed, Helium at position step - 1, draw the text, the depformer: the samples [n, K]."""
        steps = self.cfg.depformer_steps if self.all_steps else self.cfg.codebooks
        hidden, text_logits = self.helium(self.temporal.embed(inputs), (local - 1)[:, None], slice(0, n),
                                          self.active[:n])  # (the fused ring attention skips the held rows)
        text = self.sampling.text(text_logits[:, 0].float(), local)  # [n]
        text_in = torch.where(provided[:, 0], goal[:, 0], text)
        audio = self.steps(hidden, text_in, goal[:, 1:], provided[:, 1:],
                               lambda logits, t: self.sampling.audio(logits, local, t), steps=steps)  # [n, steps]
        return torch.cat([text[:, None], audio, goal[:, 1 + steps:]], dim=1)  # user rows: always provided

    @torch.no_grad()
    def prefill(self, rows: slice, plan: Plan, start: int, stop: int) -> None:
        """Read prompt positions start..stop - 1 of `plan` into the key/value rings of the slots `rows`."""
        x = self.embed_prompt(plan, start, stop)  # [T, D]
        count = len(range(self.slots)[rows])
        positions = torch.arange(start, stop, device=self.device).expand(count, -1)  # [B, T]
        with prompt_attention(self.device):
            self.temporal.trunk(x[None].expand(count, -1, -1), positions, rows)

    def embed_prompt(self, plan: Plan, start: int, stop: int) -> torch.Tensor:
        """Helium's inputs [T, D] of prompt positions start..stop - 1."""
        inputs = to_device(plan.inputs[start:stop], self.device)  # [T, K]
        x = self.temporal.embed(inputs)[:, 0]  # [T, D]
        # a stored voice: its embeddings are the whole input, a run of positions copied at once (not one by one)
        for first, last in voice_runs(plan.embeddings[start:stop]):
            run = [e for e in plan.embeddings[start + first:start + last] if e is not None]  # all of them
            x[first:last] = torch.stack(run).to(x.device, x.dtype)  # [last - first, D]
        return x

    def finish(self, rows: slice, plan: Plan) -> None:
        """The slots `rows` take the staging ring and step of their read prompt."""
        self.ring[rows] = to_device(plan.ring, self.device)
        self.provided[rows] = to_device(plan.provided, self.device)
        self.local[rows] = plan.ticks

"""The lockstep tick: B slots advance one 80 ms frame together through Helium and the depformer.

Token rows (K = 17): text, agent codebooks 0..7, user codebooks 0..7, each with a delay
(text 0, codebook 0 0, codebooks 1..7 1). State, as in PP-lm `LMGen` and the seed:
`ring` [B, K, CT = max_delay + 3] of tokens, `provided` [B, K, CT] (a value was written
from outside and must not be overwritten by a sample), one physical offset `phys` shared
by all slots, and each slot's local step `local` [B] (where it is in its own stream).

One tick at physical offset o (`tick`):
1. Restore a voice bundle's staging cache into slots whose prefill step asks for it,
   rolled by the slot's phase (o - local).
2. Write the user codes, and the forced agent/text tokens of slots in prefill, at column
   (o + delay) % CT, marking them provided.
3. Warm-up gate: rows whose delay is >= the slot's local step get their initial token
   (text: text_card, audio: card) at column o % CT.
4. o == 0 is the cold start: column 0 is set to the initial tokens and nothing runs.
5. The model input is column (o - 1) % CT, embedded (or replaced by a voice embedding),
   through Helium at each slot's position; the text is sampled; the depformer expands
   the audio codebooks, teacher-forced where column o % CT is provided.
6. Column (o - 1) % CT stops being provided; samples go to column o % CT where nothing
   was provided.
7. Output (slots past warm-up, local > max_delay): the de-delayed frame,
   token k from column (o - max_delay + delay_k) % CT.

Design choices:
- Slot positions are Helium's key/value positions. A slot whose stream is reset
  (`reset_streams`, the verb of streaming.py) while others converse restarts at
  position -1: its sacrifice tick writes a key no later tick can see (layers.py), so its
  history and that write are both masked, and from its next tick on it runs exactly the
  positions of a fresh stream.
- The depformer runs the agent's 8 steps only. Its steps 8..15 predict the user codebooks,
  whose targets are always provided (user codes, or the sine / initial tokens, are
  written before every tick, and the warm-up gate covers a fresh slot), and the depformer
  is causal over steps, so skipping them changes no agent code: the reference's own
  inference (reference/personaplex.md §1.4), checked against `all_steps=True` by
  tests/engine/personaplex/test_slots.py. It halves the depformer's work.
- Everything per slot is a row of a static tensor; phases (prefill, live) are data (the
  per-slot `PrefillStep`), never branches inside the model. The model part of a tick
  (`_model_step`: embeddings, Helium, text sampling, depformer) reads and writes static
  buffers only, so on CUDA it is captured once as a graph (engine/graphs.py) and replayed
  every tick; host bookkeeping (ring writes, gates, output gather) stays eager.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.graphs import StepGraphs
from engine.personaplex.config import LMConfig
from engine.personaplex.depformer import Depformer
from engine.personaplex.prompt import PrefillStep
from engine.personaplex.temporal import Temporal

Sampler = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class TickOut:
    ran: bool  # False on the cold-start tick
    tokens: torch.Tensor | None  # [B, K] the de-delayed frame (valid where `ready`)
    ready: list[bool]  # slots past warm-up
    embeddings: torch.Tensor | None  # [B, 1, D] the model input embeddings as computed from tokens


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


class Lockstep:
    def __init__(self, cfg: LMConfig, temporal: Temporal, depformer: Depformer, slots: int, device: torch.device,
                 all_steps: bool = False, graphs: bool = False):
        self.cfg = cfg
        self.all_steps = all_steps
        self.temporal = temporal
        self.depformer = depformer
        self.slots = slots
        self.device = device
        self.use_graphs = graphs and device.type == "cuda"
        K, CT = cfg.rows, cfg.ring_columns
        dtype = temporal.text_linear.weight.dtype
        # The model step's static inputs and outputs (`_model_step`, graph-capturable).
        self.inputs = torch.zeros(slots, K, dtype=torch.long, device=device)  # model input column
        self.goal = torch.zeros(slots, K, dtype=torch.long, device=device)  # target column
        self.goal_provided = torch.zeros(slots, K, dtype=torch.bool, device=device)
        self.override = torch.zeros(slots, 1, cfg.dim, dtype=dtype, device=device)  # voice embeddings
        self.override_rows = torch.zeros(slots, dtype=torch.bool, device=device)
        self.embeddings = torch.zeros(slots, 1, cfg.dim, dtype=dtype, device=device)
        self.sampled = torch.zeros(slots, K, dtype=torch.long, device=device)  # text + audio codes
        self.set_samplers(greedy, greedy, None)
        self.initial = torch.tensor([cfg.text_card] + [cfg.card] * cfg.n_q, device=device)  # [K]
        self.delays = torch.tensor(cfg.delays, device=device)  # [K]
        self.warmup = torch.tensor(cfg.delays)  # [K] on the host, next to `local`
        self.sine = torch.tensor(cfg.sine_tokens, device=device)  # [codebooks]
        self.rows = torch.arange(K, device=device)
        self.ring = torch.zeros(slots, K, CT, dtype=torch.long, device=device)
        self.provided = torch.zeros(slots, K, CT, dtype=torch.bool, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self.local = torch.zeros(slots, dtype=torch.long)  # CPU: gates and output decisions
        self.phys = 0
        temporal.setup_streams(slots)
        depformer.setup_streams(slots)
        self.cold_start()

    def cold_start(self) -> None:
        """Every slot fresh and the physical offset back to 0: the next tick is the cold start."""
        self.phys = 0
        self.reset_streams(torch.ones(self.slots, dtype=torch.bool))

    def reset_streams(self, rows: torch.Tensor) -> None:
        """The slots marked in `rows` (bool [B]) start fresh streams at the next tick (their
        sacrifice tick); the other slots are unaffected. Helium's and the depformer's rings
        need nothing: the slot's positions restart at -1 (streaming.py, layers.py)."""
        rows = rows.to(torch.bool)
        self.ring[rows.to(self.device)] = self.initial[:, None]
        self.provided[rows.to(self.device)] = False
        self.local[rows.cpu()] = 0
        self.positions[rows.to(self.device)] = -1

    def set_samplers(self, text: Sampler, audio: Sampler, generator: torch.Generator | None) -> None:
        """The samplers of the model step (`generator`: the one they draw from); drops captured graphs."""
        self.samplers = (text, audio)
        self.graphs = StepGraphs(lambda _: self._model_step(), [0], enabled=self.use_graphs,
                                 generators=() if generator is None else (generator,))

    def phase(self, slot: int) -> int:
        return (self.phys - int(self.local[slot])) % self.cfg.ring_columns

    def _write_inputs(self, user: torch.Tensor, steps: list[PrefillStep | None]) -> None:
        """Steps 1-3, and the voice embeddings that replace some slots' input this tick."""
        B, n, o, CT = self.slots, self.cfg.codebooks, self.phys, self.cfg.ring_columns
        for slot, step in enumerate(steps):
            if step is not None and step.restore is not None:
                self.ring[slot] = torch.roll(step.restore.to(self.device), shifts=self.phase(slot), dims=-1)
        values = torch.cat([self.initial[None, :1 + n].expand(B, -1), user.to(self.device)], dim=1)  # [B, K]
        write = torch.zeros(B, self.cfg.rows, dtype=torch.bool)
        write[:, 1 + n:] = True
        self.override_rows.zero_()
        for slot, step in enumerate(steps):
            if step is None:
                continue
            write[slot] = True
            values[slot, 1 + n:] = self.sine if step.user_sine else self.initial[1 + n:]
            values[slot, 0] = step.text
            if step.agent is not None:
                values[slot, 1:1 + n] = torch.tensor(step.agent, device=self.device)
            if step.embedding is not None:
                self.override[slot, 0] = step.embedding.to(self.device)
                self.override_rows[slot] = True
        write = write.to(self.device)
        cols = (o + self.delays) % CT  # [K]
        self.ring[:, self.rows, cols] = torch.where(write, values, self.ring[:, self.rows, cols])
        self.provided[:, self.rows, cols] |= write
        gate = (self.local[:, None] <= self.warmup[None]).to(self.device)  # [B, K]
        self.ring[:, :, o % CT] = torch.where(gate, self.initial[None], self.ring[:, :, o % CT])
        self.provided[:, :, o % CT] |= gate

    def _model_step(self) -> None:
        """Step 5 on static buffers only: embed (or take the voice embedding), Helium, text, depformer."""
        sample_text, sample_audio = self.samplers
        n = self.cfg.depformer_steps if self.all_steps else self.cfg.codebooks
        embeddings = self.temporal.embed(self.inputs)  # [B, 1, D]
        self.embeddings.copy_(embeddings)
        x = torch.where(self.override_rows[:, None, None], self.override, embeddings)
        hidden, text_logits = self.temporal(x, self.positions[:, None])
        text = sample_text(text_logits[:, 0].float())  # [B]
        goal, provided = self.goal, self.goal_provided
        text_in = torch.where(provided[:, 0], goal[:, 0], text)
        audio = self.depformer(hidden, text_in, goal[:, 1:], provided[:, 1:], sample_audio, steps=n)  # [B, n]
        self.sampled[:, 0] = text
        self.sampled[:, 1:1 + n] = audio
        self.sampled[:, 1 + n:] = goal[:, 1 + n:]  # the user rows are always provided

    @torch.no_grad()
    def tick(self, user: torch.Tensor, steps: list[PrefillStep | None]) -> TickOut:
        """user [B, codebooks] codes; steps[b] is slot b's prefill step, None when live."""
        self._write_inputs(user, steps)
        o, CT = self.phys, self.cfg.ring_columns
        if o == 0:
            self.ring[:, :, 0] = self.initial[None]
            self._advance()
            return TickOut(False, None, [False] * self.slots, None)
        source, target = (o - 1) % CT, o % CT
        self.inputs.copy_(self.ring[:, :, source])
        self.goal.copy_(self.ring[:, :, target])
        self.goal_provided.copy_(self.provided[:, :, target])
        if self.use_graphs and not self.graphs.graphs:
            self.graphs.capture()  # its runs only rewrite this tick's key/value slots and scratch buffers
        self.graphs(0)
        self.provided[:, :, source] = False
        self.ring[:, :, target] = torch.where(self.goal_provided, self.goal, self.sampled)
        ready = (self.local > self.cfg.max_delay).tolist()
        cols = (o - self.cfg.max_delay + self.delays) % CT  # [K]
        tokens = self.ring[:, self.rows, cols]  # [B, K]
        self._advance()
        return TickOut(True, tokens, ready, self.embeddings.clone())

    def _advance(self) -> None:
        self.phys += 1
        self.local += 1
        self.positions += 1

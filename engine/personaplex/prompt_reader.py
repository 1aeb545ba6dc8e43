"""A joining conversation's system prompt read by CUDA graphs: chunks into a scratch row of
Helium's rings, then the row copied into the conversation's slot.

    reader = PromptReader(lockstep, graphs=True)   # the lockstep's rings have a scratch row
    reader.capture()                               # a graph per chunk length, and the copy's
    reader.read(plan, start, stop)                 # prompt positions start..stop - 1, into the scratch row
    reader.copy_to(slot)                           # the whole prompt read: the slot takes the row

Design choices:
- Why: a chunk launched op by op is ~3,200 kernels at the released size, ~24 ms of GPU work
  but ~50-70 ms of host time on an H100 (stop 36's profile), and a chunk is read before a
  tick: every talking conversation waited for it. A replay costs one launch.
- A graph cannot follow a slot (its ring rows are views at addresses baked into it), so the
  prompt is read into one row that never moves: Helium's rings get a row past the slots
  (Lockstep's `scratch`), outside every tick's bucket. When the prompt is read, one more
  graph copies that row of every ring (keys, values, float8 scales) into the slot, the slot
  a device index.
- A chunk runs at the next of CHUNK_LENGTHS, its positions past the prompt's padding: their
  keys land in ring slots that the conversation writes before it reads them, as a tick's do
  (ring.py); only the prompt's own positions are ever seen. The row's older content (the last
  prompt read) is as invisible as a slot's after its conversation ends.
- Embedding the chunk's tokens stays eager (a few dozen launches): its inputs are copied into
  the graphs' static input; the first position is a device scalar, so no value of the host
  is baked into a graph.
- One prompt at a time: the engine reads the oldest waiting prompt to its end before the next
  (a prompt dropped midway is simply overwritten by the next, from position 0).
- Its chunks run without autograd whoever calls them: with it on, the rings' in-place writes
  chained every layer's saved activations from chunk to chunk (59 GiB held by a
  one-conversation engine at the released size on stop 42's H100, from the captures' warm-up
  calls alone). The engine's modules are frozen as well (engine.py `build`).
- The engine uses it on CUDA only; a CPU reads prompts in place, bit for bit as before (a
  padded chunk's GEMMs round differently). The tests run it on the CPU too, eagerly.
"""

from __future__ import annotations

import torch

from engine.graphs import StepGraphs
from engine.personaplex.lockstep import Lockstep, prompt_attention
from engine.personaplex.prompt import Plan
from engine.personaplex.ring import FP8

CHUNK_LENGTHS = (32, 64, 128, 256)  # the engine's PROMPT_CHUNK is the longest


class PromptReader:
    def __init__(self, lockstep: Lockstep, graphs: bool) -> None:
        assert lockstep.scratch is not None, "the lockstep's rings need a scratch row"
        self.lockstep = lockstep
        self.row = slice(lockstep.scratch, lockstep.scratch + 1)
        temporal, device = lockstep.temporal, lockstep.device
        longest = max(CHUNK_LENGTHS)
        dtype = temporal.text_emb.weight.dtype
        self.x = torch.zeros(longest, temporal.cfg.dim, dtype=dtype, device=device)  # the chunk's inputs [T, D]
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # its first position
        self.offsets = torch.arange(longest, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # where copy_to puts the row
        self.chunks = StepGraphs(self._chunk, CHUNK_LENGTHS, enabled=graphs, name="system prompt chunk")
        self.copies = StepGraphs(self._copy, [1], enabled=graphs, name="system prompt copy")

    @staticmethod
    def made(lockstep: Lockstep, graphs: bool) -> PromptReader | None:
        """A reader with its graphs captured; None where the lockstep has no scratch row (a CPU)."""
        if lockstep.scratch is None:
            return None
        reader = PromptReader(lockstep, graphs)
        reader.capture()
        return reader

    def capture(self) -> None:
        self.chunks.capture()
        self.copies.capture()

    def read(self, plan: Plan, start: int, stop: int) -> None:
        """Prompt positions start..stop - 1 (at most the longest chunk) into the scratch row."""
        count = stop - start
        assert 0 < count <= max(CHUNK_LENGTHS)
        self.x[:count].copy_(self.lockstep.embed_prompt(plan, start, stop))  # [count, D]
        self.start.fill_(start)
        self.chunks(count)  # the graph of the next chunk length, its rows past `count` padding

    def copy_to(self, slot: int) -> None:
        """The scratch row of every ring into `slot`'s."""
        self.slot.fill_(slot)
        self.copies(1)

    @torch.no_grad()  # (captured at an engine's build, outside any caller's no_grad: the docstring's why)
    def _chunk(self, length: int) -> None:
        positions = (self.start + self.offsets[:length])[None]  # [1, T]
        with prompt_attention(self.lockstep.device):
            self.lockstep.temporal.trunk(self.x[None, :length], positions, self.row)

    @torch.no_grad()
    def _copy(self, _: int) -> None:
        for ring in self.lockstep.temporal.rings():
            for state in (ring.keys, ring.values, ring.key_scales, ring.value_scales):
                if state.numel():
                    bytes_ = state.view(torch.uint8) if state.dtype == FP8 else state  # no float8 index_copy
                    bytes_.index_copy_(0, self.slot, bytes_[self.row].clone())  # (the source may not alias)

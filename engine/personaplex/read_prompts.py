"""System prompts read once: Helium's key/value rows of a read prompt, kept to start the next
conversation with the same persona and voice by a copy instead of reading it again.

    kept = ReadPrompts(temporal, most=8)
    key = kept.key(plan)                  # the plan's inputs and voice embeddings, hashed
    if kept.restore(key, slot): ...       # the slot's rings hold the read prompt: it can listen
    else: ...read it...; kept.keep(key, plan, slot)

Why: a system prompt is read a chunk before each tick (engine.py), and every tick that reads
one is longer for every talking conversation: on the H200, 127 conversations opened at once
listened after 10.5 s p50, and the others' frames waited for the chunks meanwhile. A server's
conversations mostly share a few personas and voices (the default ones, a studio's cast).

Design choices:
- What reading a prompt leaves in a slot is its staging ring and step (the plan's, set by
  `Lockstep.finish`) and, in each Helium layer's ring, the keys and values of positions
  0 .. P - 1 (ring slots 0 .. P - 1: a prompt fits the context). Nothing else: the depformer
  and the draws do not run, Mimi restarts after it. So a read prompt is those ring rows,
  copied out after a slot read them and copied into the next slot: the same bytes the
  reading would write, so a conversation started from a kept prompt is the conversation
  started by reading it (tests/engine/personaplex/test_read_prompts.py, bit for bit).
- Rows past P keep what the slot's previous conversation left: a query at position q sees
  only positions it wrote since, as after a reading (ring.py).
- Keyed by what the model reads (the plan's inputs, and each position's voice embedding),
  not by names: a voice clip's prompt is kept as well as a named voice's, and a persona
  edited by one character is another key.
- Conversations queued with the same prompt before any had read it are copied in too, once
  one has (engine.py `_copy_read_prompts`, a few a tick): 127 opened at once read it once.
- At most `most` prompts (least recently used dropped): each is P x 2 x heads x head_dim
  bytes a layer in the ring's dtype (~70 MB at the released size, float8, 250 positions).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

from engine.personaplex.prompt import Plan
from engine.personaplex.temporal import Temporal

READ_PROMPTS = 8  # read system prompts kept per engine


class ReadPrompts:
    def __init__(self, temporal: Temporal, most: int = READ_PROMPTS) -> None:
        self.rings = temporal.rings()
        self.most = most
        self.kept: OrderedDict[bytes, list[torch.Tensor]] = OrderedDict()  # key -> per ring: its tensors' rows
        self.hits = self.misses = 0

    @staticmethod
    def key(plan: Plan) -> bytes:
        """What the model reads of this prompt, hashed: its inputs and its voice embeddings."""
        digest = hashlib.sha256(plan.inputs.numpy().tobytes())
        digest.update(bytes(embedding is not None for embedding in plan.embeddings))  # which positions
        voice = [embedding for embedding in plan.embeddings if embedding is not None]
        if voice:  # one copy to the host for all of them
            digest.update(torch.stack(voice).detach().float().cpu().numpy().tobytes())  # [E, D]
        return digest.digest()

    def state(self, slot: int, positions: int) -> list[torch.Tensor]:
        """Views of the slot's ring rows 0 .. positions - 1: keys, values (and their float8 scales) per ring."""
        views = []
        for ring in self.rings:
            for tensor in (ring.keys, ring.values, ring.key_scales, ring.value_scales):
                if tensor.numel():
                    views.append(tensor[slot, :, :positions])  # [heads, P, head_dim] or scales [heads, P]
        return views

    def keep(self, key: bytes, plan: Plan, slot: int) -> None:
        """The slot has just read `plan`: keep its ring rows under `key` (dropping the least recent past `most`)."""
        if self.most < 1 or key in self.kept:
            return
        self.kept[key] = [view.clone() for view in self.state(slot, plan.positions)]
        while len(self.kept) > self.most:
            self.kept.popitem(last=False)

    def has(self, key: bytes) -> bool:
        return key in self.kept

    def restore(self, key: bytes, plan: Plan, slot: int) -> bool:
        """Copy the kept prompt `key` into the slot's rings; False (nothing copied) if it is not kept."""
        rows = self.kept.get(key)
        if rows is None:
            self.misses += 1
            return False
        self.kept.move_to_end(key)
        torch._foreach_copy_(self.state(slot, plan.positions), rows)
        self.hits += 1
        return True

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for rows in self.kept.values() for t in rows)

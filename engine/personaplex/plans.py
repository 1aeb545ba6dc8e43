"""System prompts planned once: a conversation opening with a persona and a named voice seen
before takes the kept plan and key instead of planning them again.

    plans = Plans(make, key)                             # make(persona, voice) -> Plan; key(plan) -> bytes
    planned, key = plans.get(persona, voice)             # voice: a name, None or the default (kept);
                                                         # a Voice (a clip's) is planned every time

Design choices:
- Why: planning steps the staging ring position by position on the host (prompt.py `plan`:
  hundreds of small tensor operations, 14 ms a conversation on 2 CPU cores) and the key hashes
  the voice's embeddings after a copy to the host (read_prompts.py). On the H200 (stop 48) 127
  conversations opening at once waited p50 1.1 s and p99 1.8 s for their system prompts, the
  loop starting them one after another, and those already listening piled up frames meanwhile
  (tick latency p99 1.1 s while the ticks took p95 27 ms). With the plan kept, a start is
  the read prompt's copy (read_prompts.py), the slot's reset and its streams'.
- Keyed by the persona and the voice as asked: the same arguments plan the same prompt (a
  voice bundle is read once, at its first use). A `Voice` object
  (a clip's) is planned each time: its codes are the clip's.
- At most `most` plans, the least recently used dropped; a plan holds its voice's embeddings
  (views of one tensor a voice, on the device: a few MB).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from engine.personaplex.prompt import Plan

MOST_PLANS = 32

Planned = tuple[Plan, bytes]  # the plan and its key (read_prompts.py)


class Plans:
    def __init__(self, make: Callable[[str | None, object], Plan], key: Callable[[Plan], bytes],
                 most: int = MOST_PLANS) -> None:
        self.make, self.key, self.most = make, key, most
        self.kept: OrderedDict[tuple[str | None, Hashable], Planned] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, persona: str | None, voice: object) -> Planned:
        """The plan and key of the system prompt of `persona` with `voice` (kept where `voice` is a
        name, None or the engine's default sentinel)."""
        if not (voice is None or isinstance(voice, str) or type(voice) is object):
            return self.planned(persona, voice)  # a Voice: a clip's codes
        key = (persona, voice)
        planned = self.kept.get(key)
        if planned is None:
            self.misses += 1
            planned = self.kept[key] = self.planned(persona, voice)
            while len(self.kept) > self.most:
                self.kept.popitem(last=False)
        else:
            self.hits += 1
            self.kept.move_to_end(key)
        return planned

    def planned(self, persona: str | None, voice: object) -> Planned:
        made = self.make(persona, voice)
        return made, self.key(made)

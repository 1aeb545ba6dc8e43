"""The prefix cache: snapshots of a slot's model state at a prompt's cuts, so a take
prefills only the rows after the longest prefix an earlier take already computed.

    cache = PrefixCache(model, budget_bytes, host_bytes=0)   # the Decoder holds it (decoder.prefix)
    plan = cache.plan(prompt)                    # the keys of the prompt's cuts, the longest hit
    start, hidden = cache.restore(plan, slot)    # the hit's state into the slot: prefill rows [start, R)
    cache.record(plan, slot, end, hidden)        # after each prefill chunk: a snapshot if it ends at a cut
    cache.kept(plan, slot)                       # rows of the plan's prefix the slot holds already
    cache.decoding(slot, row)                    # the slot's take decodes from `row`: its rows in place end there
    cache.stats()                                # hits, misses, rows saved, bytes held

Directing retakes one line over and over, and moves on line by line: a scene's prompt is the
system message (voice references), the kept takes above (history turns), then the line. A
retake shares the whole prompt with the take before; the next line after a keep, all but its own.

Design choices:
- Snapshot points are the prompt's cuts (prefill.py `cuts`): its end, and its boundaries
  (prompt.py: the ends of the system message and of each turn, where prompts of a scene
  part) in the GRID-row cell of the last one (1,024 rows: prefill.py's largest chunk);
  before that cell, every GRID rows. No chunk spans a cut, and on the H200 a chunk costs
  about the same whatever its rows, so a cold 4,260-row prompt cut at its 20 turns took
  843.6 ms, in 512-row chunks 425.6 (docs/perf.md). The price: a prompt that parts from an
  earlier one in an earlier cell resumes up to GRID - 1 rows early.
- A snapshot holds what a prefill leaves in the slot: every attention cache's rows (the
  backbone's full-attention layers, the tower's) and every Gated DeltaNet layer's recurrent
  and convolution states after its last row; a whole prompt's also its last hidden state.
- Why it is exact. (1) The key of a snapshot at cut b hashes rows [0, b] and every cut up
  to b, so same key means same inputs and the same chunks. It includes row b, one past the
  prefix, because the tower's caches are teacher-forced: row b - 1's tower entries are
  computed with row b as their label. (The row after a system message or a turn is the
  `<|im_start|>` of the next turn or line, so prompts of a scene share it.) A whole-prompt
  snapshot hashes rows [0, R) and an end mark: its tower row R - 1 holds the placeholder
  label the first decode step overwrites before it is read, as after a fresh prefill. (2) No
  chunk spans a cut, and the chunks between two cuts are laid out from the earlier one
  (prefill.py `begin`): the chunked DeltaNet rule and GEMM blocking round differently for
  different row splits, so a resumed prefill runs exactly the calls a prefill from row 0
  runs after that cut, and a snapshot holds the state that prefill had there. In float32 on
  a CPU the take is the same bit for bit; on the GPU too, as far as its kernels are
  deterministic (within the fast path's tolerance in any case). (3) The decoder zeroes the
  slot's rows past the restored prefix (decoder.py: a masked row still enters attention's
  sum with weight 0, and 0 * NaN is NaN), so what an earlier take left there is never read.
  Sampling is not part of the prefill: a take's generator is seeded after a hit as after one.
- A tree of snapshots (as sglang's Mamba radix cache): a snapshot keeps the attention rows
  of its own segment, from its parent's cut, and restoring copies its chain's segments. Its
  DeltaNet states are its own, and are dropped separately: under memory pressure an inner
  snapshot loses its states (it still serves its children's rows) before its rows go, and
  only a snapshot with no children loses its rows.
- Memory: one budget for the device, least recently used first (a snapshot's use is its
  own: recorded, or restored from), so the states of a cut nobody resumes from go before
  other scenes' retake points; rows stay while a later snapshot needs them. But a warm's
  last snapshot goes last until a take restores from it (`keep_warms`, WARM_HOLD_S at most):
  directors in turn warm seconds before their takes, the others' snapshots in between, so
  least recently used drops the very warm needed next (stop 55's H100, 48 directors: most
  restores partial; on the CPU, 4 directors in turn with room for ~3 of their chains: 6 of
  8 takes whole against 0, test_warm.py). Evicted snapshots may move to pinned host
  memory (a second budget), copied back on a hit. A snapshot whose chain (rows from 0, its
  states) could not fit the budgets even alone is not made, nor any after it in that
  prefill (it would evict the prefix that does fit). Each eviction logs a line; /metrics
  counts them. The budget (`--prefix-cache-gib`): on a GPU by default half the memory free
  after warm-up, at most 90% of it (a larger one is lowered, with a warning); 1 GiB on a CPU.
- Rows in place: a slot keeps its rows after its take (a released slot's writes go to the
  scratch slot), so `restore` copies only the chain's rows the slot does not hold (by the
  keys of the prompt it last prefilled, up to the rows that prefill reached), and the decoder
  starts a prompt in the free slot holding most of it: a retake copies the DeltaNet states and
  its line's rows. A take's first step rewrites its prompt's last row in the tower's caches,
  so the rows in place end at its line's boundary: a restore leaves what a prefill leaves.
- Shared across sessions: keys are the exact rows, so sessions with the same voice share the
  system message's snapshot, and a director who reconnects finds their scene's snapshots
  (same replica); no state is used for rows other than its own. A restart starts cold.
- Counters are plain integers kept by the engine thread: /metrics reads them without a lock.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field

import torch

from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.layers import KVCache
from engine.drama3.model import Drama3Model
from engine.drama3.prefill import cuts
from engine.drama3.prompt import Prompt
from engine.readback import pinned_like

log = logging.getLogger("retake.engine")

END_MARK = b"end of prompt"  # a whole-prompt key's last part: never a row's bytes (44 of them)
CPU_BUDGET_GIB = 1.0  # the default budget on a CPU
GPU_FREE_SHARE = 0.5  # the default budget on a GPU: this share of the memory free after warm-up
GPU_FREE_MAX = 0.9  # a budget asked for is capped at this share of it (the takes need the rest)
WARM_HOLD_S = 300.0  # a warm's snapshot goes last this long at most (its director may have left)


@dataclass(eq=False)
class Snapshot:
    """A slot's state at a cut: the attention rows of its segment [start, end), the
    DeltaNet states after row end - 1, and (a whole prompt) that row's hidden state."""

    key: bytes
    parent: Snapshot | None
    start: int
    end: int
    kv: list[torch.Tensor]  # per attention cache, its keys then its values: [end - start, Hkv, Dh] each
    states: list[torch.Tensor] | None  # per DeltaNet layer: conv [C, K-1], recurrent [Hv, Dk, Dv]; None: dropped
    hidden: torch.Tensor | None = None  # [D], whole-prompt snapshots only
    children: int = 0
    used: int = 0  # the cache's clock when its states were last recorded or restored
    waiting: float | None = None  # a warm's last snapshot no take restored yet: since (perf_counter)
    on_host: bool = False

    @property
    def rows_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)

    @property
    def states_bytes(self) -> int:
        tensors = (self.states or []) + ([] if self.hidden is None else [self.hidden])
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def nbytes(self) -> int:
        return self.rows_bytes + self.states_bytes

    @property
    def resumable(self) -> bool:
        """Its states are kept: a prefill can resume here (a whole prompt also needs its hidden)."""
        return self.states is not None


@dataclass
class Plan:
    """One prefill's use of the cache: its snapshot points and where it resumed."""

    rows: int  # R
    points: dict[int, bytes]  # row count -> key: each cut, then R (the whole prompt)
    start: int = 0  # rows restored from a snapshot
    node: Snapshot | None = None  # the last snapshot on the prompt's path (restored or recorded)
    hidden: torch.Tensor | None = None  # a whole-prompt hit's last hidden state
    stop: int | None = None  # a warm's (a prefill-only take's) last row: its snapshot there waits for its take


@dataclass
class Stats:
    hits: int = 0  # whole prompts restored: nothing prefilled
    partial_hits: int = 0  # a prefix restored, the rest prefilled
    misses: int = 0  # prefilled from row 0
    rows_saved: int = 0  # prompt rows restored instead of prefilled
    rows_in_place: int = 0  # of those, rows the slot held already: not copied
    rows_prefilled: int = 0
    snapshots: int = 0  # held now
    device_bytes: int = 0
    host_bytes: int = 0
    evictions: int = 0  # snapshots (or their states) dropped for memory
    spills: int = 0  # snapshots moved to host memory

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class PrefixCache:
    """Snapshots of prompt prefixes for one model's slots; owned by the engine thread."""

    model: Drama3Model
    budget: int  # bytes on the model's device
    host_budget: int = 0  # bytes of pinned host memory for spilled snapshots (0: evicted ones are dropped)
    nodes: dict[bytes, Snapshot] = field(default_factory=dict)
    counters: Stats = field(default_factory=Stats)
    clock: int = 0
    keep_warms: bool = True  # a warm's last snapshot is evicted after every other, until a take restores it
    # per slot: the keys of the prompt it last prefilled (row count -> key) and the rows of it in place
    held: dict[int, tuple[dict[int, bytes], int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.caches = [m for m in self.model.modules() if isinstance(m, KVCache)]
        self.deltanets = [m for m in self.model.modules() if isinstance(m, GatedDeltaNet)]
        self.device = self.model.candidate_head.device
        if self.device.type != "cuda":
            self.host_budget = 0  # the device is the host already

    # Sizes ------------------------------------------------------------------------

    @property
    def row_bytes(self) -> int:
        """Bytes of one prompt row in a snapshot: keys and values of every attention cache."""
        return sum(2 * c.k[0, 0].numel() * c.k.element_size() for c in self.caches)

    @property
    def state_bytes(self) -> int:
        """Bytes of one snapshot's DeltaNet states (conv and recurrent, every layer)."""
        return sum(d.conv_state[0].numel() * d.conv_state.element_size()
                   + d.recurrent_state[0].numel() * d.recurrent_state.element_size() for d in self.deltanets)

    def fit_free_memory(self, free: int, asked: bool) -> None:
        """At warm-up on a GPU, with `free` bytes free: the default budget is a share of them; a
        budget asked for is capped at most of them (snapshots past the free memory would fail
        the takes that record them), with a warning."""
        if not asked:
            self.budget = int(GPU_FREE_SHARE * free)
        elif self.budget > GPU_FREE_MAX * free:
            log.warning("prefix cache: %.1f GiB asked for, but %.1f GiB of GPU memory are free after warm-up; "
                        "the budget is %.1f GiB (give a smaller --prefix-cache-gib to silence this)",
                        self.budget / 2**30, free / 2**30, GPU_FREE_MAX * free / 2**30)
            self.budget = int(GPU_FREE_MAX * free)
        self.fit()  # what warm-up recorded, within the budget now

    def stats(self) -> dict[str, int]:
        return self.counters.as_dict()

    # Keys ---------------------------------------------------------------------------

    def plan(self, prompt: Prompt) -> Plan:
        """The prompt's snapshot points and keys, and its longest resumable prefix in the
        cache (touched)."""
        count = len(prompt.rows)
        data = prompt.rows.to(torch.int32).contiguous().numpy().data.cast("B")  # ids fit; views: a retake's path
        row = len(data) // max(1, count)
        digest = hashlib.sha256()
        points: dict[int, bytes] = {}
        previous = 0
        for cut in cuts(prompt):
            digest.update(data[previous * row:cut * row])
            digest.update(cut.to_bytes(8, "little"))
            labelled = digest.copy()
            labelled.update(data[cut * row:(cut + 1) * row])  # the label of the tower's last row
            points[cut] = labelled.digest()
            previous = cut
        digest.update(data[previous * row:])
        digest.update(END_MARK)
        points[count] = digest.digest()
        plan = Plan(rows=count, points=points)
        for end, key in points.items():  # ascending; snapshots past the last resumable one get their states again
            node = self.nodes.get(key)
            if node is None:
                break
            if node.resumable and (end < count or node.hidden is not None):
                plan.start, plan.node = end, node
        if plan.node is not None:
            self.touch(plan.node)
            plan.hidden = plan.node.hidden if plan.start == count else None
        return plan

    # Restoring ----------------------------------------------------------------------

    def kept(self, plan: Plan, slot: int) -> int:
        """Rows [0, k) of the plan's resume prefix that `slot` holds already: k is the plan's
        furthest point up to its start with the same key as a point of the slot's last prompt
        that its prefill reached (same key, same rows and label)."""
        keys, rows = self.held.get(slot, ({}, 0))
        return max((end for end, key in plan.points.items()
                    if end <= min(plan.start, rows) and keys.get(end) == key), default=0)

    def decoding(self, slot: int, row: int) -> None:
        """The slot's take decodes from `row` on (its prompt's last row, whose tower entries
        the first step rewrites): its rows are in place up to there only."""
        if slot in self.held:
            keys, rows = self.held[slot]
            self.held[slot] = (keys, min(rows, row))

    def restore(self, plan: Plan, slot: int) -> tuple[int, torch.Tensor | None]:
        """Copy the plan's resume snapshot (its chain's rows the slot does not hold, its
        states) into `slot`; the rows to prefill from, and the last hidden state when the
        whole prompt was restored."""
        counters = self.counters
        kept = self.kept(plan, slot)
        self.held[slot] = (dict(plan.points), plan.start)  # (record's clear of plan.points leaves these rows right)
        if not plan.start:
            counters.misses += 1
            counters.rows_prefilled += plan.rows
            self.log(slot, plan)
            return 0, None
        node = plan.node
        assert node is not None and node.states is not None
        node.waiting = node.waiting if plan.stop is not None else None  # a take's restore: its warm has served
        chain: list[Snapshot] = []  # the snapshots from the root to `node`
        cursor: Snapshot | None = node
        while cursor is not None:
            chain, cursor = [cursor, *chain], cursor.parent
        # Per attention cache (keys, values), one `cat` of the chain's segments into the slot's contiguous
        # rows (a copy_ each: 23.1 ms for a 4,000-row hit of 21 segments on the H200); one segment (a
        # retake's line) goes with the states, one launch a dtype (46 launches: ~1 ms on an H100).
        chain = [snapshot for snapshot in chain if snapshot.end > kept]  # from row `kept`
        states = [state for layer in self.deltanets for state in (layer.conv_state[slot], layer.recurrent_state[slot])]
        pairs = list(zip(states, node.states, strict=True))  # (into, from)
        for index, cache in enumerate(self.caches if kept < plan.start else []):
            for part, into in ((2 * index, cache.k), (2 * index + 1, cache.v)):
                segments = [snapshot.kv[part] if not snapshot.on_host else
                            snapshot.kv[part].to(self.device, non_blocking=True) for snapshot in chain]
                if kept > chain[0].start:  # (the one view: of the segment `kept` falls in)
                    segments[0] = segments[0][kept - chain[0].start:]
                if len(segments) == 1:
                    pairs.append((into[slot, kept:plan.start], segments[0]))
                else:
                    torch.cat(segments, out=into[slot, kept:plan.start])  # [start - kept, Hkv, Dh]
        for dtype in {into.dtype for into, _ in pairs}:  # a fused copy takes one dtype
            group = [pair for pair in pairs if pair[0].dtype == dtype]
            torch._foreach_copy_([into for into, _ in group], [saved for _, saved in group], non_blocking=True)
        counters.hits += plan.start == plan.rows
        counters.partial_hits += plan.start < plan.rows
        counters.rows_saved += plan.start
        counters.rows_in_place += kept
        counters.rows_prefilled += plan.rows - plan.start
        self.log(slot, plan, kept)
        return plan.start, None if plan.hidden is None else plan.hidden.to(self.device, non_blocking=True)

    def log(self, slot: int, plan: Plan, kept: int = 0) -> None:
        """One line per prefill: what it reused, and what the cache holds."""
        stats = self.counters
        what = "the whole prompt" if plan.start == plan.rows else "a prefix" if plan.start else "nothing"
        log.info("prefix cache: slot %d restored %s (%s of %s rows, %s in place), prefills %s; %d snapshots, %.1f MiB "
                 "on the device, %.1f MiB on the host; %d hits, %d partial, %d misses, %s rows saved", slot, what,
                 f"{plan.start:,}", f"{plan.rows:,}", f"{kept:,}", f"{plan.rows - plan.start:,}", stats.snapshots,
                 stats.device_bytes / 2**20, stats.host_bytes / 2**20, stats.hits, stats.partial_hits, stats.misses,
                 f"{stats.rows_saved:,}")

    # Recording ----------------------------------------------------------------------

    def record(self, plan: Plan, slot: int, end: int, hidden: torch.Tensor) -> None:
        """After a prefill chunk of `slot` ending at row `end`: if `end` is one of the plan's
        points, keep the slot's state there (hidden [D]: the chunk's last row)."""
        keys, _ = self.held.get(slot, ({}, 0))
        self.held[slot] = (keys, end)
        key = plan.points.get(end)
        if key is None or end <= plan.start:
            return
        parent = plan.node
        start = 0 if parent is None else parent.end
        if (parent is not None and self.nodes.get(parent.key) is not parent) \
                or (end - start) * self.row_bytes + self.state_bytes > self.budget \
                or end * self.row_bytes + self.state_bytes > self.budget + self.host_budget:
            # Its parent went while it ran, or it could not fit, or its chain (rows [0, end), its states)
            # could not, even alone: no snapshots from here on (recording one would only evict the others).
            plan.points.clear()
            return
        last = hidden.clone() if end == plan.rows else None
        node = self.nodes.get(key)
        if node is not None:  # made by another prefill of the same rows, or kept without its states
            if node.states is None:
                node.states, node.hidden = self.copy_states(slot), last
                if node.on_host:
                    node.states = [to_pinned(t) for t in node.states]
                    node.hidden = None if last is None else to_pinned(last)
                self.account(node, node.states_bytes)
        else:
            node = Snapshot(key, parent, start, end, kv=[rows[slot, start:end].clone() for c in self.caches
                                                         for rows in (c.k, c.v)],
                            states=self.copy_states(slot), hidden=last)
            self.nodes[key] = node
            if parent is not None:
                parent.children += 1
            self.counters.snapshots += 1
            self.account(node, node.nbytes)
        plan.node = node
        node.waiting = time.perf_counter() if end == plan.stop else node.waiting
        self.touch(node)
        self.fit()

    def copy_states(self, slot: int) -> list[torch.Tensor]:
        return [state for layer in self.deltanets
                for state in (layer.conv_state[slot].clone(), layer.recurrent_state[slot].clone())]

    # Memory -------------------------------------------------------------------------

    def touch(self, node: Snapshot) -> None:
        """Its states were used (recorded or restored). Its parents' rows are kept while it
        is, whatever their own use: only their states age."""
        self.clock += 1
        node.used = self.clock

    def account(self, node: Snapshot, nbytes: int) -> None:
        if node.on_host:
            self.counters.host_bytes += nbytes
        else:
            self.counters.device_bytes += nbytes

    def fit(self) -> None:
        """Evict least recently used snapshots (or their states) until both budgets hold; a log
        line says what went when anything did."""
        before = Stats(**self.counters.as_dict())
        resumable = {key for key, node in self.nodes.items() if node.resumable}
        held = time.perf_counter() - WARM_HOLD_S  # warms since then go last (`keep_warms`)
        for host in (False, True):
            budget = self.host_budget if host else self.budget
            while (self.counters.host_bytes if host else self.counters.device_bytes) > budget:
                victim = min((n for n in self.nodes.values() if n.on_host == host and (n.children == 0 or n.resumable)),
                             key=lambda n: (self.keep_warms and (n.waiting or 0) > held, n.used), default=None)
                if victim is None:
                    break
                if not host and self.host_budget and victim.nbytes <= self.host_budget:
                    self.spill(victim)
                else:
                    self.drop(victim)
        self.log_eviction(before, resumable)

    def log_eviction(self, before: Stats, resumable: set[bytes]) -> None:
        """One line per fit that evicted: what went (of the snapshots resumable before it), and
        what the cache holds now against its budgets."""
        now = self.counters
        if now.evictions == before.evictions and now.spills == before.spills:
            return
        stripped = sum(1 for key in resumable if key in self.nodes and not self.nodes[key].resumable)
        log.info("prefix cache: over its budget, evicted the least recently used: %d snapshots dropped, %d kept "
                 "their rows but lost their DeltaNet states, %d moved to the host; now %d snapshots, %.1f of %.1f MiB "
                 "on the device, %.1f of %.1f MiB on the host", before.snapshots - now.snapshots, stripped,
                 now.spills - before.spills,
                 now.snapshots, now.device_bytes / 2**20, self.budget / 2**20, now.host_bytes / 2**20,
                 self.host_budget / 2**20)

    def spill(self, node: Snapshot) -> None:
        """Move a snapshot to pinned host memory (copied back on a hit)."""
        size = node.nbytes
        node.kv = [to_pinned(t) for t in node.kv]
        node.states = None if node.states is None else [to_pinned(t) for t in node.states]
        node.hidden = None if node.hidden is None else to_pinned(node.hidden)
        self.counters.device_bytes -= size
        node.on_host = True
        self.counters.host_bytes += size
        self.counters.spills += 1

    def drop(self, node: Snapshot) -> None:
        """A snapshot with children loses its states; one without goes, and so do the
        stateless parents it leaves childless."""
        self.counters.evictions += 1
        if node.children:
            self.account(node, -node.states_bytes)
            node.states, node.hidden = None, None
            return
        cursor: Snapshot | None = node
        while cursor is not None and cursor.children == 0 and (cursor is node or not cursor.resumable):
            del self.nodes[cursor.key]
            self.account(cursor, -cursor.nbytes)
            self.counters.snapshots -= 1
            parent = cursor.parent
            if parent is not None:
                parent.children -= 1
            cursor = parent

    def clear(self) -> None:
        """Forget every snapshot (a cold cache, as after a restart)."""
        self.nodes.clear()
        self.counters.snapshots = self.counters.device_bytes = self.counters.host_bytes = 0


def to_pinned(tensor: torch.Tensor) -> torch.Tensor:  # (spills run on CUDA only: pinned_like pins there)
    return pinned_like(tensor).copy_(tensor, non_blocking=True)


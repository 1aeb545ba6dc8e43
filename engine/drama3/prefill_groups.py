"""Several prompts' next prefill chunks run as one batched chunk: [prompts, rows].

    groups = PrefillGroups(chunked, scratch=N, most=8)   # beside a ChunkedPrefill, same caches
    groups.capture()                                     # CUDA: a graph per (shape, KV bucket), into the scratch slot
    group = groups.pick(prefills)                        # the waiting prefills whose next chunks fit a group
    groups.run(group, after)                             # one chunk of each; each prefill's hidden once done

On the H200 a prefill chunk costs about the same for 40 rows as for 93 (32 ms, docs/perf.md;
likely because a chunk reads nearly every expert of every layer whatever its rows), so 64 directors
starting at once paid 64 such chunks one after another while their first audio waited.
A group reads the weights once for up to 8 prompts.

Design choices:
- A group is a batch of prompts, not one packed sequence: each prompt keeps its own slot,
  positions and DeltaNet state (`Backbone.forward` takes [B, T] rows, positions [B, T],
  slots [B] and `valid` [B]), so the model needs nothing new. Each prompt contributes the
  next chunk of its own layout (prefill.py: cut-relative chunks), padded to the group's
  rows like a graphed chunk is (`valid`: DeltaNet skips the padding; its KV writes land
  past the prompt's rows, where its next rows are written before any row attends them).
- Shapes: (8 prompts, 64 rows) and (4 prompts, 128 rows), 512 rows either way: the size of
  the largest single chunk, so a group's activations fit the memory pool the single chunks
  already use. A chunk ending past the 4,096-row KV bucket runs alone (its attention is
  large). A chunk longer than 128 rows runs alone too, unless others wait: then its first
  128 rows join theirs, cut likewise, where they fill the shape and prefill at least the
  rows it would alone (`cut`: one reading of the weights for all; its rest is its next chunk).
- On CUDA each shape is captured per KV bucket (1,024, 4,096) into the prefill's pool: 4
  more graphs at warm-up. A graph runs its shape's prompts; a group with fewer fills the
  rest with idle rows in the scratch slot (position 0, one row, nothing anyone reads).
- Warms (the server's prefill-only takes of a next line) fill the rows a group of takes
  leaves idle when their chunks are no longer than its longest (`fill`): a graph computes
  every row of its shape, so they ride for nothing, and never in a take's place.
- The slot table's budget (admission.py) counts a group as its longest chunk: what it costs
  on the H200, where a chunk's cost hardly follows its rows. Counting every row would teach
  the admission a per-row cost that a single chunk then overruns.
- Numerics: a prompt's chunk in a group is not bit for bit the same chunk alone (a GEMM's
  blocking depends on its rows: float32 on the CPU differs in the 6th digit), so groups are
  on where chunks are graphs (CUDA), where batched steps already differ by that much, and
  off on a CPU by default, which keeps the CPU's takes and prefix snapshots exact (tests
  compare them bit for bit). Tests run the groups on the CPU against single chunks with a
  tolerance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.drama3.prefill import ChunkedPrefill, Prefill
from engine.graphs import StepGraphs
from engine.readback import to_device

GROUP_SHAPES = ((8, 64), (4, 128))  # (prompts, rows) of a grouped chunk, fewest rows first
PREFILL_GROUP = 8  # the most prompts a group holds, where groups are on
GROUP_KV_ROWS = 4096  # the furthest row a grouped chunk may end at (past it: alone)


class PrefillGroups:
    """Grouped chunks over a ChunkedPrefill's model and caches."""

    def __init__(self, chunked: ChunkedPrefill, *, scratch: int, most: int) -> None:
        self.chunked, self.scratch, self.most = chunked, scratch, most
        device, width = chunked.device, chunked.model.config.frame_width
        takes, rows = max(t for t, _ in GROUP_SHAPES), max(r for _, r in GROUP_SHAPES)
        # Static inputs and output of the graphed groups.
        self.rows = torch.zeros((takes, rows, width), dtype=torch.long, device=device)
        self.labels = torch.zeros((takes, rows, width), dtype=torch.long, device=device)
        self.start = torch.zeros(takes, dtype=torch.long, device=device)
        self.valid = torch.ones(takes, dtype=torch.long, device=device)
        self.slot = torch.full((takes,), scratch, dtype=torch.long, device=device)
        self.index = torch.arange(takes, device=device)
        self.last = torch.zeros((takes, chunked.last.shape[0]), dtype=chunked.last.dtype, device=device)
        self.buckets = [b for b in chunked.buckets if b <= GROUP_KV_ROWS] or chunked.buckets[:1]
        graphed = chunked.graphed and most > 1
        pool = chunked.pool
        self.graphs = {shape: StepGraphs(functools.partial(self.static_group, *shape), self.buckets,
                                         enabled=graphed, pool=pool, name=f"prefill group {shape[0]}x{shape[1]} rows")
                       for shape in GROUP_SHAPES if shape[1] <= chunked.max_rows} if graphed else {}

    @property
    def captured(self) -> bool:
        return all(graphs.captured for graphs in self.graphs.values())

    def capture(self) -> None:
        """Capture every shape's graphs (CUDA, groups on), writing the scratch slot only."""
        self.idle()
        for graphs in self.graphs.values():
            graphs.capture()

    def idle(self) -> None:
        """Every static prompt row one row in the scratch slot (what a capture runs)."""
        self.start.zero_()
        self.valid.fill_(1)
        self.slot.fill_(self.scratch)

    def shape(self, count: int) -> tuple[int, int] | None:
        """The group shape a chunk of `count` rows can join (the fewest rows that hold it)."""
        return next((shape for shape in GROUP_SHAPES if count <= shape[1]), None)

    def pick(self, prefills: list[Prefill]) -> list[Prefill]:
        """The prefills whose next chunks run as one group: the first prefill and those after
        it (in order) whose chunks fit a shape that holds the first's, up to the shape's
        prompts, in the shape that takes the most; [] when fewer than two fit (the first runs
        alone; a first chunk longer than every shape: `cut`)."""
        if self.most < 2 or len(prefills) < 2 or not prefills[0].chunks:
            return []
        if not self.groupable(prefills[0]):
            return self.cut(prefills)
        best: list[Prefill] = []
        for takes, rows in GROUP_SHAPES:
            group = [p for p in prefills if p.chunks and (c := p.chunks[0])[1] - c[0] <= rows and self.fits(*c, rows)]
            group = group[:min(takes, self.most)]
            if group and group[0] is prefills[0] and len(group) > len(best):
                best = group
        return best if len(best) >= 2 else []

    def cut(self, prefills: list[Prefill]) -> list[Prefill]:
        """`pick` when the first prefill's chunk is longer than every shape: the first prefill and
        those after it in the shape of the most rows, each chunk cut to its rows (the rest stays the
        prefill's next chunk), if they fill the shape and prefill at least the rows the first chunk
        would alone (it costs about as much: the weights are read once); else [] (the first runs
        alone: fewer would pay a chunk for little, and its rest another). Why: on stop 41's H100 at
        64 directors a second take's ~255-row chunk ran alone, and so did its ~50-row rest, ~22 ms
        each; 2 groups formed in 10 s."""
        takes, rows = GROUP_SHAPES[-1]
        group = [p for p in prefills
                 if p.chunks and self.fits(p.chunks[0][0], min(p.chunks[0][1], p.chunks[0][0] + rows), rows)]
        group = group[:min(takes, self.most)]
        first, end = prefills[0].chunks[0]
        if len(group) < takes or group[0] is not prefills[0] \
                or sum(min(b - a, rows) for a, b in (p.chunks[0] for p in group)) < end - first:
            return []
        for prefill in group:
            a, b = prefill.chunks[0]
            if b - a > rows:  # (as prefill.py `run` cuts one beside decoding takes)
                prefill.chunks[0] = (a, a + rows)
                prefill.chunks.insert(1, (a + rows, b))
        return group

    def fill(self, group: list[Prefill], others: list[Prefill]) -> list[Prefill]:
        """Of `others` (in order), those whose next chunks fit the rows `group` (from `pick`)
        leaves idle in its shape, without making its longest chunk longer: they run for nothing."""
        chunks = [p.chunks[0] for p in group]
        longest = max(end - first for first, end in chunks)
        shape = self.shape(longest)
        assert shape is not None, "pick chose the group"
        room = min(shape[0], self.most) - len(group)
        riders = [p for p in others if p.chunks and (c := p.chunks[0])[1] - c[0] <= longest and self.fits(*c, shape[1])]
        return riders[:max(0, room)]

    def groupable(self, prefill: Prefill) -> bool:
        """The prefill's next chunk can run in a group (it fits a shape, the cache and the buckets)."""
        if not prefill.chunks:
            return False
        first, end = prefill.chunks[0]
        shape = self.shape(end - first)
        return shape is not None and self.fits(first, end, shape[1])

    def fits(self, first: int, end: int, rows: int) -> bool:
        """A chunk [first, end) padded to `rows` stays in the cache and in the groups' KV buckets."""
        return first + rows <= self.chunked.max_rows and end <= self.buckets[-1]

    def run(self, group: list[Prefill], after: list[Callable[[int, torch.Tensor], None] | None]) -> None:
        """The next chunk of each prefill in `group` (from `pick`), as one batched chunk; then
        each prefill's `after(end, hidden)`. A prefill whose chunks are all run has its last
        row's hidden [D] in `prefill.hidden` (a view the next group overwrites)."""
        chunks = [prefill.chunks.popleft() for prefill in group]
        shape = self.shape(max(end - first for first, end in chunks))
        assert shape is not None, "pick chose the group"
        hidden = self.graphed(group, chunks, shape) if shape in self.graphs else self.eager(group, chunks, shape[1])
        for prefill, (_, end), call, row in zip(group, chunks, after, hidden, strict=True):
            prefill.hidden = row
            if call is not None:
                call(end, row)

    def eager(self, group: list[Prefill], chunks: list[tuple[int, int]], rows: int) -> torch.Tensor:
        """The group launched op by op: its prompts only, each chunk padded to `rows`. [B, D]."""
        device = self.chunked.device
        padded = [(F.pad(p.rows[a:b], (0, 0, 0, rows - (b - a))), F.pad(p.labels[a:b], (0, 0, 0, rows - (b - a))))
                  for p, (a, b) in zip(group, chunks, strict=True)]
        frames = torch.stack([r for r, _ in padded])  # [B, T, 11]
        labels = torch.stack([lab for _, lab in padded])
        start = to_device(torch.tensor([a for a, _ in chunks]), device)  # [B]
        valid = to_device(torch.tensor([b - a for a, b in chunks]), device)  # [B]
        slots = to_device(torch.tensor([p.slot for p in group]), device)  # [B]
        positions = start[:, None] + torch.arange(rows, device=device)[None]  # [B, T]
        hidden = self.chunked.forward(frames, labels, positions, slots, max(b for _, b in chunks), valid)
        return hidden[torch.arange(len(group), device=device), valid - 1]  # [B, D]

    def graphed(self, group: list[Prefill], chunks: list[tuple[int, int]], shape: tuple[int, int]) -> torch.Tensor:
        """The group as its shape's graph replay: the static inputs filled, idle rows in the
        scratch slot. [B, D], views of the static output."""
        self.load(group, chunks, shape)
        self.graphs[shape](max(b for _, b in chunks))
        return self.last[:len(group)]

    def load(self, group: list[Prefill], chunks: list[tuple[int, int]], shape: tuple[int, int]) -> None:
        """The chunks [first, end) of the group's prefills into the static inputs of `shape`,
        each padded, the shape's idle prompts one row in the scratch slot (also a mixed step's
        group: mixed.py)."""
        takes, rows = shape
        self.rows[:takes, :rows].zero_()  # padding: zeros, to be plain (they change no real row)
        self.labels[:takes, :rows].zero_()
        for i, (prefill, (first, end)) in enumerate(zip(group, chunks, strict=True)):
            self.rows[i, :end - first].copy_(prefill.rows[first:end])
            self.labels[i, :end - first].copy_(prefill.labels[first:end])
        idle = takes - len(group)
        host = torch.tensor([[a for a, _ in chunks] + [0] * idle, [b - a for a, b in chunks] + [1] * idle,
                             [p.slot for p in group] + [self.scratch] * idle])  # [3, takes]
        self.start[:takes], self.valid[:takes], self.slot[:takes] = to_device(host, self.chunked.device)

    def static_inputs(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The static group of `shape`: its rows and labels [B, T, 11] and positions [B, T]."""
        takes, rows = shape
        positions = self.start[:takes, None] + self.chunked.offsets[None, :rows]  # [B, T]
        return self.rows[:takes, :rows], self.labels[:takes, :rows], positions

    def keep_last(self, hidden: torch.Tensor) -> None:
        """Each static prompt's last real row of hidden [B, T, D] into `last`."""
        takes = hidden.shape[0]
        self.last[:takes].copy_(hidden[self.index[:takes], self.valid[:takes] - 1])

    def static_group(self, takes: int, rows: int, kv_len: int) -> None:
        """The group a graph captures: `takes` prompts of `rows` static rows, `valid` of each real;
        each prompt's last real row's hidden into `last`."""
        frames, labels, positions = self.static_inputs((takes, rows))
        self.keep_last(self.chunked.forward(frames, labels, positions, self.slot[:takes], kv_len,
                                            self.valid[:takes]))  # [B, T, D]

"""A prompt's rows into one slot's caches, chunk by chunk; on CUDA each chunk a graph replay.

    chunked = ChunkedPrefill(model, max_rows, graphs=True)
    chunked.capture()                           # CUDA: a graph per (chunk rows, KV bucket)
    prefill = chunked.begin(rows, slot, start=0)          # rows [R, 11] on the device
    hidden = chunked.run(prefill, rows=256)     # about 256 rows of chunks; the last row's hidden [D] once done

Eager prefill is host-bound: a 300-row prompt launched ~6,000 small kernels from Python
(152 ms on the H200, of which its kernels took 35.5 ms). Replaying each chunk as a CUDA
graph leaves only the kernels.

Design choices:
- A chunk runs the backbone over its rows and teacher-forces the tower over the same rows,
  each labelled by the prompt's next row. The prompt's last row has no next row: it is
  labelled by itself, a placeholder the first decode step overwrites (that step writes
  every tower layer's cache at the last row's position before attending it). So a chunk
  is one function of fixed shapes: its rows and labels, its first position and slot
  (device tensors), and the cache rows its attention reads.
- With graphs, a prompt is cut into chunks of 1,024 rows and a last chunk padded up to the
  next graph size (powers of two, 1 to 1,024, and 320, 384 and 768 between them; 300 rows:
  one chunk in the 320-row graph, where the 512-row one computed 212 rows of padding: on
  the H200 a 300-row prompt took 32.5 ms in it, the experts' bytes ~9 of them, the rest
  following the rows).
  Fewer, larger chunks: each chunk reads every expert the routing touches, which for a few
  hundred rows is nearly all of them (32 GB in FP8 at the full size), and launches the same
  ~2,400 kernels whatever its rows, so 300 rows cut as 256 + 32 + 8 + 4 read the experts
  four times (95 ms on the H200, 2026-12-03) where one padded chunk reads them once. By stop
  36 and 38's H100 runs a chunk costs ~21 ms plus ~0.022 ms a row (93 rows in the 128-row
  graph 23.7 ms, 300 in the 320-row one 28.6, two 512-row chunks 64.2); with 1,024-row
  chunks 4,000 rows took 237 ms on an H100 where nine 512-row chunks took 300 (stop 40). The
  cap is what one chunk may cost: a prefill beside decoding takes runs chunks of at most
  BESIDE_ROWS (512) rows, splitting a longer one (admission.py: a step holds at least one
  chunk, ~43 ms for 1,024 rows by that line where a frame plays 46). Padded rows sit at the
  positions after the chunk's real rows: their cache writes land where the take's next rows
  will be written before any row attends them, DeltaNet skips them (`valid`: no write, no
  decay, the conv state ends at the last real row), and only the last real row's hidden is
  kept. Near the cache's end, where a padded chunk would not fit, exact power-of-two chunks
  finish the prompt. Without graphs (a CPU), chunks of 512 rows: the fewest launches, where
  a chunk's cost follows its rows.
- A chunk's attention reads a static number of cache rows (its KV bucket: 1,024, 4,096 or
  all of them), at least its last position + 1; rows past a query's position are masked.
  With 14 chunk sizes that is 42 graphs at the full size, captured once at warm-up, all
  in one memory pool (they never run at once: the engine thread replays them).
- A chunk size whose code cannot be captured (a host sync: a MoE path that reads counts on
  the host, say) runs eagerly instead, with the reason logged once; so does every chunk
  when graphs are off. Warm-up runs under CUDA's sync debug mode "error" to find those
  before a capture would fail (engine/graphs.py).
- The slot's DeltaNet state starts from zero when the first chunk starts at position 0,
  and carries on from the slot's state otherwise (`start` > 0: a prefix already in it,
  restored by the prefix cache).
- Chunks never span a cut (`cuts`: where the prefix cache may snapshot), and the chunks between
  two cuts are laid out from the earlier one. The chunked DeltaNet rule and a GEMM's
  blocking depend on where a call starts and how many rows it has, so a float32 state is
  bit for bit reproducible only if the same rows go through the same calls: with
  cut-relative chunks, a prefill resumed at a cut runs exactly the calls a prefill from
  row 0 runs after it.
- A prefill runs a few chunks at a time (`run(prefill, rows)`), so the slot table can put
  a new prompt's chunks between the decode steps of the takes already playing instead of
  stalling them for the whole prompt.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.drama3.model import Drama3Model
from engine.drama3.prompt import Prompt
from engine.graphs import StepGraphs, shared_pool
from engine.readback import to_device

EAGER_CHUNK_ROWS = 512  # without graphs
BESIDE_ROWS = 512  # the largest chunk a step runs beside decoding takes (~33 ms on an H100)
GRAPH_CHUNK_ROWS = (1024, 768, 512, 384, 320, *(256 >> i for i in range(9)))  # 1,024, 768, 512, ..., 1: a graph each
PREFILL_KV_ROWS = (1024, 4096)  # KV buckets of graphed chunks, then the whole cache


GRID = max(GRAPH_CHUNK_ROWS)  # rows between the cuts before the last boundary's cell: one whole chunk


def cuts(prompt: Prompt) -> tuple[int, ...]:
    """Where the prompt's prefill cuts its chunks and the cache may keep a snapshot: every GRID
    rows up to the GRID-row cell that holds the prompt's last boundary (the end of its
    history), then each boundary from that cell on. A prompt shorter than GRID rows: each
    boundary. The cuts up to a row depend only on the boundaries up to it and on which cell
    the last one is in, so two prompts agree on them up to a shared snapshot point."""
    count = len(prompt.rows)
    inner = [b for b in prompt.boundaries if 0 < b < count]
    if not inner:
        return ()
    cell = max(inner) // GRID * GRID
    return tuple(sorted({*range(GRID, cell + 1, GRID), *(b for b in inner if b >= cell)}))


def padded_chunks(start: int, end: int, limit: int,
                  sizes: tuple[int, ...] = GRAPH_CHUNK_ROWS) -> list[tuple[int, int]]:
    """[start, end) cut into chunks of the largest size and a last chunk that `padded_size`
    pads up to a graph size; near `limit` (the cache's rows), where padding would not fit,
    exact sizes (largest first) instead."""
    chunks, position, largest = [], start, max(sizes)
    while position < end:
        left = end - position
        if left >= largest:
            chunks.append((position, position + largest))
        elif position + min(s for s in sizes if s >= left) <= limit:
            chunks.append((position, end))
        else:
            chunks.append((position, position + max(s for s in sizes if s <= left)))
        position = chunks[-1][1]
    return chunks


def padded_size(first: int, end: int, limit: int, sizes: tuple[int, ...] = GRAPH_CHUNK_ROWS) -> int:
    """The graph size a chunk of rows [first, end) runs in: the smallest that holds it and
    fits the cache's `limit` rows (its own size if it is one)."""
    return min(s for s in sizes if s >= end - first and (first + s <= limit or s == end - first))


def even_chunks(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) cut into chunks of EAGER_CHUNK_ROWS (the last one shorter)."""
    return [(s, min(s + EAGER_CHUNK_ROWS, end)) for s in range(start, end, EAGER_CHUNK_ROWS)]


@dataclass
class Prefill:
    """One prompt's prefill in progress: its rows and labels on the device, its chunks to run."""

    rows: torch.Tensor  # [R, 11]
    labels: torch.Tensor  # [R, 11]: each row's next row (the last row: itself)
    slot: int
    chunks: collections.deque[tuple[int, int]]  # [start, end) row ranges still to run, in order
    hidden: torch.Tensor | None = None  # [D]: the last chunk's last row (a prefix-cache hit: the prompt's)
    cached: int = 0  # rows restored from the prefix cache instead of prefilled
    prefill_only: bool = False  # a prefill for the prefix cache alone (a `stop`): its slot never decodes


class ChunkedPrefill:
    """Prefill of one slot at a time, over a model whose caches are set up."""

    def __init__(self, model: Drama3Model, max_rows: int, *, graphs: bool) -> None:
        self.model, self.max_rows = model, max_rows
        device = self.device = model.candidate_head.device
        self.graphed = graphs
        width, largest = model.config.frame_width, max(GRAPH_CHUNK_ROWS)
        # Static inputs and output of the graphed chunks.
        self.rows = torch.zeros((largest, width), dtype=torch.long, device=device)
        self.labels = torch.zeros((largest, width), dtype=torch.long, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        self.valid = torch.zeros(1, dtype=torch.long, device=device)  # [1]: the chunk's real rows (the rest padding)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.offsets = torch.arange(largest, device=device)  # [largest]: positions from start
        self.last = torch.zeros(model.config.text.hidden_size, dtype=model.candidate_head.dtype, device=device)
        self.buckets = sorted({b for b in PREFILL_KV_ROWS if b < max_rows} | {max_rows})
        pool = self.pool = shared_pool() if graphs and device.type == "cuda" else None
        # Only chunks that fit the cache: a prompt never has more rows, and a 512-row chunk's
        # capture in a 414-row cache would read rope rows past its end (a device-side assert).
        self.graphs = {size: StepGraphs(functools.partial(self.static_chunk, size), self.buckets, enabled=graphs,
                                        pool=pool, name=f"prefill {size} rows")
                       for size in GRAPH_CHUNK_ROWS if size <= max_rows} if graphs else {}

    def chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        return padded_chunks(start, end, self.max_rows) if self.graphed else even_chunks(start, end)

    @property
    def captured(self) -> bool:
        return all(graphs.captured for graphs in self.graphs.values())

    def capture(self, slot: int = 0) -> None:
        """Capture every chunk size's graphs (CUDA, graphs on), writing `slot`'s caches (a
        scratch slot, or one no take is using)."""
        self.slot.fill_(slot)
        self.start.zero_()
        self.valid.fill_(1)
        for graphs in self.graphs.values():
            graphs.capture()

    def forward(self, rows: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                kv_len: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """One chunk: rows and labels [1, T, 11] at positions [1, T] of slots [1] -> hidden [1, T, D]
        (valid [1]: the real rows, the rest padding; None: all)."""
        model = self.model
        hidden: torch.Tensor = model.backbone(model.embed(rows), positions, slots, kv_len, valid)  # [1, T, D]
        model.tower.prefill(hidden, positions, rows, labels, slots, kv_len)
        return hidden

    def static_chunk(self, size: int, kv_len: int) -> None:
        """The chunk a graph captures: the first `size` static rows, `valid` of them real; the
        last real row's hidden into `last`."""
        rows, labels, positions = self.static_inputs(size)
        # A one-row chunk has no padding, and runs the compiled decode layers: as a decode call (no
        # `valid`), not a new compile of them.
        hidden = self.forward(rows, labels, positions, self.slot, kv_len, self.valid if size > 1 else None)
        self.keep_last(hidden)

    def static_inputs(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The static chunk of `size` rows: its rows and labels [1, T, 11] and positions [1, T]."""
        positions = self.start[:, None] + self.offsets[None, :size]  # [1, T]
        return self.rows[None, :size], self.labels[None, :size], positions

    def keep_last(self, hidden: torch.Tensor) -> None:
        """The static chunk's last real row of hidden [1, T, D] into `last`."""
        self.last.copy_(hidden[0].index_select(0, self.valid - 1)[0])

    def begin(self, rows: torch.Tensor, slot: int, start: int = 0, cuts: tuple[int, ...] = ()) -> Prefill:
        """A prefill of rows [start, R) of `rows` [R, 11] (on the device) into `slot`, at their
        positions; `run` does the chunks. A chunk never spans a cut (a row count): the chunks
        between two cuts are laid out from the earlier one, so the state at a cut, and every
        chunk after it, is the same whether the prefill started at row 0 or resumed there."""
        count = len(rows)
        if not 0 <= start <= count <= self.max_rows or count == 0:
            raise ValueError(f"rows {start}..{count} do not fit the {self.max_rows} cache rows")
        labels = torch.cat((rows[1:], rows[-1:]))  # [R, 11]: the next row; the last row its own placeholder
        edges = [start, *(cut for cut in cuts if start < cut < count), count]
        chunks = [chunk for first, end in itertools.pairwise(edges) for chunk in self.chunks(first, end)]
        return Prefill(rows, labels, slot, collections.deque(chunks))

    def run(self, prefill: Prefill, rows: int | None = None,
            after: Callable[[int, torch.Tensor], None] | None = None,
            largest: int | None = None) -> torch.Tensor | None:
        """Run the prefill's next chunks, about `rows` rows of them (at least one chunk; None:
        all), calling `after(end, hidden)` after each (the prefix cache's snapshots). Once its
        last chunk has run: the last row's hidden state [D] (a view the next chunk
        overwrites; `prefill.hidden` when there was nothing to run), else None. `largest` (a
        graph size): a longer chunk runs as its first `largest` rows, the rest left for later
        (beside decoding takes, so one step never holds a 1,024-row chunk; its remainder still
        fits the padding its chunk had)."""
        done = 0
        while prefill.chunks and (rows is None or done < rows):
            first, end = prefill.chunks.popleft()
            if largest is not None and end - first > largest:
                prefill.chunks.appendleft((first + largest, end))
                end = first + largest
            prefill.hidden = self.chunk(prefill, first, end)
            if after is not None:
                after(end, prefill.hidden)
            done += end - first
        return prefill.hidden if not prefill.chunks else None

    def chunk(self, prefill: Prefill, first: int, end: int) -> torch.Tensor:
        """Rows [first, end) of the prefill: a graph replay, or launched; the last row's hidden [D]."""
        count = end - first
        size = padded_size(first, end, self.max_rows) if self.graphed else count
        graphs = self.graphs.get(size)
        if graphs is None:  # no graphs: attend over exactly the rows so far
            positions = torch.arange(first, end, device=self.device)[None]  # [1, T]
            slots = to_device(torch.tensor([prefill.slot]), self.device)
            rows, labels = prefill.rows[None, first:end], prefill.labels[None, first:end]
            return self.forward(rows, labels, positions, slots, end)[0, -1]
        self.load(prefill, first, end, size)
        graphs(end)  # the replay of its KV bucket's graph, or the same chunk launched
        return self.last

    def load(self, prefill: Prefill, first: int, end: int, size: int) -> None:
        """Rows [first, end) of the prefill into the static chunk of `size` rows, padded."""
        count = end - first
        self.rows[:count].copy_(prefill.rows[first:end])
        self.labels[:count].copy_(prefill.labels[first:end])
        self.rows[count:size].zero_()  # padding: any rows would do (they change no real row); zeros, to be plain
        self.labels[count:size].zero_()
        self.start.fill_(first)
        self.slot.fill_(prefill.slot)
        self.valid.fill_(count)

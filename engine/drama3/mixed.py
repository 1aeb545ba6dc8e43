"""A decode step with waiting prompts' chunks beside it: the experts read once for all.

    mixed = MixedSteps(decoder, enabled=True, grouped=False)  # the decoder's: decoder.mixed
    mixed.capture()                             # CUDA: a graph per (row bucket, chunk size, KV bucket)
    if mixed.size(prefill) is not None:         # its next chunk has a size here
        done = mixed.step(position, rows, prefill)   # one frame for `rows`, and up to 256 of its rows
    if group := mixed.pick(prefills, position): # grouped: several prompts' next chunks in a group's shape
        dones = mixed.step_group(position, rows, group)   # one frame, and a chunk of each

Why: most of the bytes a step reads are its experts'. At 64 decoding rows nearly every expert of
every layer is read (stop 43's H100 profile of a 64-take step: the FP8 experts 10.1 of 18.9 ms,
at their bandwidth), and a prefill chunk run beside the step read them all again (~21 ms of a
chunk's 24-32 ms on an H100), so a new director's prompt cost the directors playing a whole
second reading. Here the chunk's rows go through each layer's experts in the same call as the
decoding rows: a chunk costs what its rows compute (~0.022 ms a row on an H100), not a reading.

Design choices:
- The composition lives outside the model: each DecoderLayer's first half, `mix` (norm,
  mixer, residual, norm), runs apart for the decoding rows ([B, 1]: the decode path, compiled
  where the fast path compiles the decode layers) and for the chunk ([1, T]: the prefill
  path, fla's chunked rule), since their shapes and states differ; its second half, `mlp`
  (router, experts, shared expert: each row alone), runs once over the B + T rows. The chunk's
  tower is then teacher-forced as a prefill chunk's is (prefill.py), and the decoding rows'
  hidden states go on as the step's feed writes them.
- The step's first half (`sample`: the frames) is the decoder's, unchanged; this is a second
  half in place of its `feed` (decoder.py `step(..., feeds)`), in the same row buckets.
- Chunk sizes 64 and 256: a shorter chunk is padded to one (`valid`, as a graphed prefill
  chunk is: DeltaNet skips the padding, whose cache rows are rewritten before they are read),
  a longer one carries its first 256 rows and leaves the rest to the next steps. Where the
  padding would pass the cache's end, the chunk runs alone as before (`fits`).
- On CUDA a graph per (row bucket, chunk size) and the prefill chunks' KV buckets (one
  covering the chunk's end and the furthest decoding row: the decode path's attention reads
  its own rows whatever the bucket), in the prefill chunks' memory pool (captured after
  them: smaller).
- Prompts asking together may ride one step together (`grouped`: `--mixed-step groups`, where
  prefill groups are on):
  the next chunks of up to 8 waiting prompts in a prefill group's shape (prefill_groups.py:
  8 x 64 or 4 x 128 rows, its static inputs), [P, T] beside the decoding rows. Why: on stop
  55's H100, 48 directors asking within 2.4 s waited p95 669-819 ms for their prompts'
  prefill, their chunks (~40-93 rows each) riding the steps one prompt a step, each step
  ~25 ms; and a carried chunk's cost hardly follows its rows (admission.py `Carrying`: 12.5
  ms for 64 rows, 16.6 for 256, its own kernels), so 8 prompts in a step cost little more
  than one. A graph per (shape, row bucket) at the groups' KV buckets (up to 4,096 rows).
  Off by default: on stop 57's H100 (48 listening directors, three runs each way) groups were
  no clear gain (first audio p95 348 / 275 / 657 ms against 992 / 302 / 322 one a step) and
  the gaps' p99 was higher in each pair (436 / 98 / 73 against 228 / 92 / 52): mostly warms
  rode them (1.4-1.6 prompts a step), in 512 padded rows.
- Numerics: the chunk's rows go through GEMMs of B + T rows, so its state is not bit for bit
  the chunk's alone (a GEMM's blocking follows its rows; float32 on the CPU differs in the 6th
  digit), as with prefill groups: on where steps are graphs, off on a CPU by default (the
  CPU's takes and prefix snapshots stay exact), and tested on the CPU against a step and a
  chunk apart with a tolerance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import torch

from engine.drama3.backbone import Backbone, DecoderLayer
from engine.drama3.fast import mix_of
from engine.drama3.model import Drama3Model
from engine.drama3.prefill import ChunkedPrefill, Prefill
from engine.drama3.prefill_groups import GROUP_SHAPES, PrefillGroups
from engine.graphs import StepGraphs

MIXED_ROWS = (64, 256)  # the chunk sizes a step carries, each a graph per row bucket


class Decoder(Protocol):
    """What mixed steps use of their decoder (decoder.py's, which owns them: typed here by its
    shape, so the two modules import in one direction)."""

    model: Drama3Model
    chunked: ChunkedPrefill
    groups: PrefillGroups
    max_rows: int
    scratch: int
    row_buckets: list[int]
    index: torch.Tensor

    def step(self, position: int, rows: list[int] | None = None, feeds: dict[int, StepGraphs] | None = None,
             feed_kv: int | None = None) -> None: ...

    def feed(self, kv_len: int | None, index: torch.Tensor | None,
             backbone: Callable[..., torch.Tensor] | None = None) -> None: ...

    def after_chunk(self, prefill: Prefill) -> Callable[[int, torch.Tensor], None] | None: ...

    def activate(self, prefill: Prefill, hidden: torch.Tensor) -> None: ...


def mixed_backbone(backbone: Backbone, mixes: Sequence[Callable[..., tuple[torch.Tensor, torch.Tensor]]],
                   embeds: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, chunk: torch.Tensor,
                   chunk_positions: torch.Tensor, chunk_slots: torch.Tensor, valid: torch.Tensor,
                   kv_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone over decoding rows embeds [B, 1, D] at positions [B, 1] of slots [B] and
    chunks [P, T, D] at chunk_positions [P, T] of chunk_slots [P] (valid [P]: their real rows)
    -> the final-normed hidden of both, [B, 1, D] and [P, T, D]. `mixes`: each layer's `mix` as
    the fast path runs it (fast.py `mix_of`: the decoding rows' call compiled, the chunk's
    compiled only with `--compile-prefill`)."""
    rope, chunk_rope = backbone.rope[positions], backbone.rope[chunk_positions]  # [B, 1, 2, r], [1, T, 2, r]
    x, rows = embeds, embeds.shape[0]
    for layer, mix in zip(cast(list[DecoderLayer], list(backbone.layers)), mixes, strict=True):
        normed, x = mix(x, rope, positions, slots, kv_len)  # [B, 1, D] each
        chunk_normed, chunk = mix(chunk, chunk_rope, chunk_positions, chunk_slots, kv_len, valid)  # [P, T, D]
        out = layer.mlp(torch.cat((normed[:, 0], chunk_normed.flatten(0, 1))))  # [B + P*T, D]: experts read once
        x, chunk = x + out[:rows, None], chunk + out[rows:].view(chunk.shape)
    return backbone.norm(x), backbone.norm(chunk)


class MixedSteps:
    """Decode steps of a Decoder that carry a prompt's chunk (see the module docstring)."""

    def __init__(self, decoder: Decoder, *, enabled: bool, grouped: bool) -> None:
        self.decoder = decoder
        chunked, groups = self.chunked, self.groups = decoder.chunked, decoder.groups
        self.mixes = [mix_of(layer) for layer in cast(list[DecoderLayer], list(decoder.model.backbone.layers))]
        self.sizes = [size for size in MIXED_ROWS if size <= decoder.max_rows] if enabled else []
        self.feeds = {size: {rows: StepGraphs(functools.partial(self.static_feed, rows, size), chunked.buckets,
                                              enabled=chunked.graphed, pool=chunked.pool,
                                              name=f"mixed step, {rows} rows, {size} chunk rows")
                             for rows in decoder.row_buckets} for size in self.sizes}
        self.shapes = [shape for shape in GROUP_SHAPES if shape[1] <= decoder.max_rows] \
            if self.sizes and grouped and groups.most > 1 else []
        self.group_feeds = {shape: {rows: StepGraphs(functools.partial(self.static_group_feed, rows, shape),
                                                     groups.buckets, enabled=chunked.graphed, pool=chunked.pool,
                                                     name=f"mixed step, {rows} rows, {shape[0]}x{shape[1]} chunk rows")
                                    for rows in decoder.row_buckets} for shape in self.shapes}

    @property
    def enabled(self) -> bool:
        return bool(self.sizes)

    @property
    def grouped(self) -> bool:
        return bool(self.shapes)

    @property
    def group_rows(self) -> int:
        """The rows a group's step carries, padding included (its shapes': 512)."""
        return max((prompts * rows for prompts, rows in self.shapes), default=0)

    def graphs(self) -> list[StepGraphs]:
        """Every (chunk size or group shape, row bucket)'s graphs."""
        return [graphs for feeds in (*self.feeds.values(), *self.group_feeds.values()) for graphs in feeds.values()]

    def capture(self) -> None:
        """Capture every (row bucket, chunk size)'s graphs (the decoder's `capture` state: every
        row inactive, writing the scratch slot; the chunk too)."""
        self.chunked.slot.fill_(self.decoder.scratch)
        self.chunked.start.zero_()
        self.chunked.valid.fill_(1)
        self.groups.idle()
        for graphs in self.graphs():
            graphs.capture()

    def size(self, prefill: Prefill, largest: int | None = None) -> int | None:
        """The chunk size that carries the prefill's next chunk (its first `largest` rows, by
        default the largest size's, if longer); None where none fits the cache (or mixed
        steps are off)."""
        if not self.sizes or not prefill.chunks:
            return None
        first, end = prefill.chunks[0]
        rows = min(end - first, largest or self.sizes[-1])
        return next((size for size in self.sizes if size >= rows and first + size <= self.decoder.max_rows), None)

    def step(self, position: int, rows: list[int], prefill: Prefill, largest: int | None = None) -> bool:
        """One frame for the decoding slots `rows` (the furthest at `position`), with the
        prefill's next chunk (its first `largest` rows, by default the largest size's: the
        rest stays its next chunk) beside them; True once its last chunk has run and its
        slot is active."""
        size = self.size(prefill, largest)
        if size is None:
            raise ValueError("the prefill's next chunk has no mixed step here: run it alone")
        chunked, decoder = self.chunked, self.decoder
        first, end = prefill.chunks.popleft()
        if end > (cut := first + min(size, largest or size)):  # the rest: its next chunks, laid out to fit the cache
            prefill.chunks.extendleft(reversed(chunked.chunks(cut, end)))
            end = cut
        chunked.load(prefill, first, end, size)
        kv = self.feeds[size][decoder.row_buckets[0]].bucket_for(max(end, position + 2))
        decoder.step(position, rows, self.feeds[size], kv)
        prefill.hidden = chunked.last  # (a view the next chunk overwrites)
        if (after := decoder.after_chunk(prefill)) is not None:
            after(end, chunked.last)
        if prefill.chunks:
            return False
        decoder.activate(prefill, chunked.last)
        return True

    def pick(self, prefills: list[Prefill], position: int) -> list[Prefill]:
        """The waiting prefills (in order) whose next chunks ride the next step together, beside
        decoding rows the furthest at `position` (prefill_groups.py `pick`: the first and those
        after it that fit its shape; [] when fewer than two fit, or the step's rows pass the
        groups' KV buckets: the first rides alone)."""
        if not self.shapes or position + 2 > self.groups.buckets[-1]:
            return []
        return self.groups.pick(prefills)

    def step_group(self, position: int, rows: list[int], group: list[Prefill]) -> list[bool]:
        """One frame for the decoding slots `rows` (the furthest at `position`), with the next
        chunk of each prefill in `group` (`pick`'s) beside them; for each, True once its last
        chunk has run and its slot is active."""
        decoder, groups = self.decoder, self.groups
        chunks = [prefill.chunks.popleft() for prefill in group]
        shape = groups.shape(max(end - first for first, end in chunks))
        assert shape in self.group_feeds, "pick chose the group"
        groups.load(group, chunks, shape)
        feeds = self.group_feeds[shape]
        decoder.step(position, rows, feeds, feeds[decoder.row_buckets[0]].bucket_for(
            max(position + 2, *(end for _, end in chunks))))
        done = []
        for prefill, (_, end), hidden in zip(group, chunks, groups.last[:len(group)], strict=True):
            prefill.hidden = hidden  # (a view the next group overwrites)
            if (after := decoder.after_chunk(prefill)) is not None:
                after(end, hidden)
            if not prefill.chunks:
                decoder.activate(prefill, hidden)
            done.append(not prefill.chunks)
        return done

    def static_feed(self, rows: int, size: int, kv_len: int) -> None:
        """What a graph captures: the decoder's feed over its first `rows` index rows, its
        backbone carrying the static chunk of `size` rows."""
        decoder = self.decoder
        decoder.feed(kv_len, decoder.index[:rows], functools.partial(self.backbone, size))

    def backbone(self, size: int, embeds: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 kv_len: int | None) -> torch.Tensor:
        """The feed's backbone call (decoding rows embeds [B, 1, D] -> hidden [B, 1, D]), with
        the static chunk through the same layers, then its tower; its last row into `last`."""
        chunked, model = self.chunked, self.decoder.model
        chunk_rows, labels, chunk_positions = chunked.static_inputs(size)
        hidden, chunk = mixed_backbone(model.backbone, self.mixes, embeds, positions, slots, model.embed(chunk_rows),
                                       chunk_positions, chunked.slot, chunked.valid, kv_len)
        model.tower.prefill(chunk, chunk_positions, chunk_rows, labels, chunked.slot, kv_len)
        chunked.keep_last(chunk)
        return hidden

    def static_group_feed(self, rows: int, shape: tuple[int, int], kv_len: int) -> None:
        """What a group's graph captures: the decoder's feed over its first `rows` index rows, its
        backbone carrying the static group of `shape`."""
        decoder = self.decoder
        decoder.feed(kv_len, decoder.index[:rows], functools.partial(self.group_backbone, shape))

    def group_backbone(self, shape: tuple[int, int], embeds: torch.Tensor, positions: torch.Tensor,
                       slots: torch.Tensor, kv_len: int | None) -> torch.Tensor:
        """The feed's backbone call with the static group's chunks [P, T] through the same layers,
        then their tower; each prompt's last real row into the groups' `last`."""
        groups, model = self.groups, self.decoder.model
        takes = shape[0]
        chunk_rows, labels, chunk_positions = groups.static_inputs(shape)  # [P, T, 11] x2, [P, T]
        hidden, chunks = mixed_backbone(model.backbone, self.mixes, embeds, positions, slots, model.embed(chunk_rows),
                                        chunk_positions, groups.slot[:takes], groups.valid[:takes], kv_len)
        model.tower.prefill(chunks, chunk_positions, chunk_rows, labels, groups.slot[:takes], kv_len)
        groups.keep_last(chunks)
        return hidden

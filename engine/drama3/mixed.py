"""A decode step with a waiting prompt's chunk beside it: the experts read once for both.

    mixed = MixedSteps(decoder, enabled=True)   # the decoder's: decoder.mixed
    mixed.capture()                             # CUDA: a graph per (row bucket, chunk size, KV bucket)
    if mixed.fits(prefill):                     # its next chunk has a size here
        done = mixed.step(position, rows, prefill)   # one frame for `rows`, and up to 256 of its rows

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
from engine.graphs import StepGraphs

MIXED_ROWS = (64, 256)  # the chunk sizes a step carries, each a graph per row bucket


class Decoder(Protocol):
    """What mixed steps use of their decoder (decoder.py's, which owns them: typed here by its
    shape, so the two modules import in one direction)."""

    model: Drama3Model
    chunked: ChunkedPrefill
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
                   chunk_positions: torch.Tensor, chunk_slot: torch.Tensor, valid: torch.Tensor,
                   kv_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone over decoding rows embeds [B, 1, D] at positions [B, 1] of slots [B] and a
    chunk [1, T, D] at chunk_positions [1, T] of chunk_slot [1] (valid [1]: its real rows) ->
    the final-normed hidden of both, [B, 1, D] and [1, T, D]. `mixes`: each layer's `mix` as
    the fast path runs it (fast.py `mix_of`: the decoding rows' call compiled, the chunk's
    compiled only with `--compile-prefill`)."""
    rope, chunk_rope = backbone.rope[positions], backbone.rope[chunk_positions]  # [B, 1, 2, r], [1, T, 2, r]
    x, rows = embeds, embeds.shape[0]
    for layer, mix in zip(cast(list[DecoderLayer], list(backbone.layers)), mixes, strict=True):
        normed, x = mix(x, rope, positions, slots, kv_len)  # [B, 1, D] each
        chunk_normed, chunk = mix(chunk, chunk_rope, chunk_positions, chunk_slot, kv_len, valid)  # [1, T, D]
        out = layer.mlp(torch.cat((normed[:, 0], chunk_normed[0])))  # [B + T, D]: each expert read once for both
        x, chunk = x + out[:rows, None], chunk + out[None, rows:]
    return backbone.norm(x), backbone.norm(chunk)


class MixedSteps:
    """Decode steps of a Decoder that carry a prompt's chunk (see the module docstring)."""

    def __init__(self, decoder: Decoder, *, enabled: bool) -> None:
        self.decoder = decoder
        chunked = self.chunked = decoder.chunked
        self.mixes = [mix_of(layer) for layer in cast(list[DecoderLayer], list(decoder.model.backbone.layers))]
        self.sizes = [size for size in MIXED_ROWS if size <= decoder.max_rows] if enabled else []
        self.feeds = {size: {rows: StepGraphs(functools.partial(self.static_feed, rows, size), chunked.buckets,
                                              enabled=chunked.graphed, pool=chunked.pool,
                                              name=f"mixed step, {rows} rows, {size} chunk rows")
                             for rows in decoder.row_buckets} for size in self.sizes}

    @property
    def enabled(self) -> bool:
        return bool(self.sizes)

    def graphs(self) -> list[StepGraphs]:
        """Every (chunk size, row bucket)'s graphs."""
        return [graphs for feeds in self.feeds.values() for graphs in feeds.values()]

    def capture(self) -> None:
        """Capture every (row bucket, chunk size)'s graphs (the decoder's `capture` state: every
        row inactive, writing the scratch slot; the chunk too)."""
        self.chunked.slot.fill_(self.decoder.scratch)
        self.chunked.start.zero_()
        self.chunked.valid.fill_(1)
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

"""The FP8 experts' "experts" layout in two Triton launches: (token, choice) pairs grouped by expert.

    rows, experts = expert_layout(topk_ids, num_experts, block_m)   # as fp8_moe.pairs_by_expert

`fp8_moe.pairs_by_expert` (the definition) sorts the pairs by expert and pads each expert's
group to whole blocks of `block_m` rows: rows [max_blocks * block_m] (a pair's index, or the
sentinel P where a block has no pair) and experts [max_blocks] (each block's expert, -1 past
the used blocks), static shapes, no host sync. In torch that is ~12 launches a MoE layer (an
argsort alone was 31 us of a 40-row prefill chunk's MoE layer on the H100, 2026-12-05): 480
a chunk or a many-take decode step at the full size.

Design choices:
- Two launches of one program per CHUNK pairs, no atomics: the first counts its chunk's pairs
  per expert (a [CHUNK, E] comparison) into its own row of a [chunks, E] table, and writes the
  sentinel over its share of the rows; the second reads the whole table (a few KiB), so each
  program knows every expert's total (the blocks and their starts: a cumulative sum) and the
  pairs of each expert in the chunks before its own, then ranks its pairs within their
  expert (a cumulative sum down its chunk) and writes them, and each block's expert for its
  share of the blocks (how many experts' blocks end at or before it). Pairs keep their order
  within an expert, as the stable argsort keeps it: the layout equals the torch one exactly.
  (It was one program walking every pair in order: 31 us a MoE layer for a 40-row chunk's
  320 pairs on the H200, 1.2 ms of that chunk, and as long in a 64-take decode step.)
- The pair count is a compile-time constant (Triton's interpreter runs loops of constant
  bounds only): one compile per pair count, which a call's rows fix (the decode step's row
  buckets, the prefill's chunk sizes, times the experts a token picks): a handful, compiled
  at warm-up before the graphs are captured.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton
    triton = None
    tl = None

CHUNK = 64  # pairs per program ([CHUNK, E] comparisons)

if triton is not None:

    @triton.jit
    def _chunk_counts_kernel(
        ids_ptr, counts_ptr, rows_ptr,  # [P] int64; int32 [CHUNKS, SPAN]; int32 [SLOTS]
        P: tl.constexpr, SLOTS: tl.constexpr, SHARE: tl.constexpr, SPAN: tl.constexpr, CHUNK_: tl.constexpr,
    ):
        c = tl.program_id(0)
        expert = tl.arange(0, SPAN)
        pair = c * CHUNK_ + tl.arange(0, CHUNK_)
        ids = tl.load(ids_ptr + pair, mask=pair < P, other=-1).to(tl.int32)
        tl.store(counts_ptr + c * SPAN + expert, tl.sum((ids[:, None] == expert[None, :]).to(tl.int32), 0))
        for start in range(0, SHARE, 256):  # this program's share of the rows: the sentinel P
            slot = c * SHARE + start + tl.arange(0, 256)
            mine = (slot < SLOTS) & (start + tl.arange(0, 256) < SHARE)
            tl.store(rows_ptr + slot, tl.zeros((256,), dtype=tl.int32) + P, mask=mine)

    @triton.jit
    def _place_kernel(
        ids_ptr, counts_ptr, rows_ptr, experts_ptr,  # [P] int64; int32 [CHUNKS, SPAN]; int32 [SLOTS]; int32 [BLOCKS]
        P: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_PAD: tl.constexpr, BLOCKS: tl.constexpr,
        BLOCK_SHARE: tl.constexpr, E: tl.constexpr, SPAN: tl.constexpr, BLOCK_M: tl.constexpr,
        CHUNK_: tl.constexpr,
    ):
        c = tl.program_id(0)
        expert = tl.arange(0, SPAN)
        chunk = tl.arange(0, CHUNKS_PAD)
        table = tl.load(counts_ptr + chunk[:, None] * SPAN + expert[None, :], mask=(chunk < CHUNKS)[:, None],
                        other=0)  # [CHUNKS_PAD, SPAN]
        counts = tl.sum(table, 0)  # [SPAN]: every expert's pairs
        seen = tl.sum(tl.where((chunk < c)[:, None], table, 0), 0)  # [SPAN]: those in the chunks before this one
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        block_end = tl.cumsum(blocks, 0)  # [SPAN]
        block_start = block_end - blocks
        pair = c * CHUNK_ + tl.arange(0, CHUNK_)
        inside = pair < P
        ids = tl.load(ids_ptr + pair, mask=inside, other=-1).to(tl.int32)
        mine = (ids[:, None] == expert[None, :]).to(tl.int32)  # [CHUNK, SPAN]
        before = tl.cumsum(mine, 0) - mine  # same-expert pairs earlier in this chunk
        rank = tl.sum(mine * (before + seen[None, :]), 1)  # [CHUNK]
        first = tl.sum(mine * block_start[None, :], 1)
        tl.store(rows_ptr + first * BLOCK_M + rank, pair.to(tl.int32), mask=inside)
        # this program's share of the blocks: each one's expert (-1 past the used ones)
        block = c * BLOCK_SHARE + tl.arange(0, BLOCK_SHARE)
        owner = tl.sum(((block_end[None, :] <= block[:, None]) & (expert[None, :] < E)).to(tl.int32), 1)
        tl.store(experts_ptr + block, tl.where(owner < E, owner, -1), mask=block < BLOCKS)


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """A static bound on sum_e ceil(count_e / block_m) over the experts that have pairs."""
    return pairs // block_m + min(num_experts, pairs)


def expert_layout(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_moe.pairs_by_expert` in two Triton launches (the same rows and experts)."""
    flat = topk_ids.reshape(-1).contiguous()  # [P]
    P = flat.numel()
    blocks_total = max_blocks(P, num_experts, block_m)
    slots = blocks_total * block_m
    chunks = triton.cdiv(P, CHUNK)
    span = triton.next_power_of_2(num_experts)
    rows = torch.empty(slots, dtype=torch.int32, device=flat.device)
    experts = torch.empty(blocks_total, dtype=torch.int32, device=flat.device)
    counts = torch.empty(chunks, span, dtype=torch.int32, device=flat.device)
    _chunk_counts_kernel[(chunks,)](flat, counts, rows, P, slots, SHARE=triton.cdiv(slots, chunks), SPAN=span,
                                    CHUNK_=CHUNK, num_warps=4)
    _place_kernel[(chunks,)](flat, counts, rows, experts, P, chunks, triton.next_power_of_2(chunks), blocks_total,
                             BLOCK_SHARE=triton.next_power_of_2(triton.cdiv(blocks_total, chunks)), E=num_experts,
                             SPAN=span, BLOCK_M=block_m, CHUNK_=CHUNK, num_warps=4)
    return rows, experts

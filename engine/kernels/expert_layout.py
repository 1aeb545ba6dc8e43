"""The FP8 experts' "experts" layout in one Triton launch: (token, choice) pairs grouped by expert.

    rows, experts = expert_layout(topk_ids, num_experts, block_m)   # as fp8_moe.pairs_by_expert

`fp8_moe.pairs_by_expert` (the definition) sorts the pairs by expert and pads each expert's
group to whole blocks of `block_m` rows: rows [max_blocks * block_m] (a pair's index, or the
sentinel P where a block has no pair) and experts [max_blocks] (each block's expert, -1 past
the used blocks), static shapes, no host sync. In torch that is ~12 launches a MoE layer (an
argsort alone was 31 us of a 40-row prefill chunk's MoE layer on the H100, 2026-12-05): 480
a chunk or a many-take decode step at the full size.

Design choices:
- One program: counts per expert (a histogram), blocks and their starts (a cumulative sum),
  then each pair's rank among the pairs of its expert before it, walked in chunks of CHUNK
  pairs with the counts so far carried between chunks (a [CHUNK, E] comparison a chunk), so
  pairs keep their order within an expert, as the stable argsort keeps it: the layout equals
  the torch one exactly.
- Every slot is written once: first the sentinel everywhere, a barrier, then the pairs; each
  block's expert is the number of experts whose blocks end at or before it.
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

CHUNK = 64  # pairs per step of the rank walk ([CHUNK, E] comparisons)
# Up to this many pairs fp8_moe uses the kernel: a many-take decode step (64 takes: 512 pairs) or a
# line's chunk. One program walks the pairs in order, so its time grows with them, where torch's
# sort runs wide: a 512-row chunk's 4,096 pairs keep the torch layout (by arithmetic, until
# `retake bench kernels`'s `expert_layout` rows say where the two cross).
LAYOUT_PAIRS = 512

if triton is not None:

    @triton.jit
    def _expert_layout_kernel(
        ids_ptr, rows_ptr, experts_ptr,  # [P] int64; int32 [BLOCKS * BLOCK_M]; int32 [BLOCKS]
        P: tl.constexpr, BLOCKS: tl.constexpr,
        E: tl.constexpr, SPAN: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK_: tl.constexpr, FILL: tl.constexpr,
    ):
        expert = tl.arange(0, SPAN)
        # counts per expert, in chunks of pairs
        counts = tl.zeros((SPAN,), dtype=tl.int32)
        for start in range(0, P, CHUNK_):
            pair = start + tl.arange(0, CHUNK_)
            ids = tl.load(ids_ptr + pair, mask=pair < P, other=-1).to(tl.int32)
            counts += tl.sum((ids[:, None] == expert[None, :]).to(tl.int32), 0)
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        block_end = tl.cumsum(blocks, 0)  # [SPAN]
        block_start = block_end - blocks
        # every slot the sentinel P, then the pairs (after a barrier: one thread may write both)
        for start in range(0, BLOCKS * BLOCK_M, FILL):
            slot = start + tl.arange(0, FILL)
            tl.store(rows_ptr + slot, tl.zeros((FILL,), dtype=tl.int32) + P, mask=slot < BLOCKS * BLOCK_M)
        tl.debug_barrier()
        seen = tl.zeros((SPAN,), dtype=tl.int32)  # pairs of each expert placed so far
        for start in range(0, P, CHUNK_):
            pair = start + tl.arange(0, CHUNK_)
            inside = pair < P
            ids = tl.load(ids_ptr + pair, mask=inside, other=-1).to(tl.int32)
            mine = (ids[:, None] == expert[None, :]).to(tl.int32)  # [CHUNK, SPAN]
            before = tl.cumsum(mine, 0) - mine  # same-expert pairs earlier in this chunk
            rank = tl.sum(mine * (before + seen[None, :]), 1)  # [CHUNK]
            first = tl.sum(mine * block_start[None, :], 1)
            tl.store(rows_ptr + first * BLOCK_M + rank, pair.to(tl.int32), mask=inside)
            seen += tl.sum(mine, 0)
        # each block's expert: how many experts' blocks end at or before it (-1 past the used ones)
        for start in range(0, BLOCKS, FILL):
            block = start + tl.arange(0, FILL)
            owner = tl.sum(((block_end[None, :] <= block[:, None]) & (expert[None, :] < E)).to(tl.int32), 1)
            tl.store(experts_ptr + block, tl.where(owner < E, owner, -1), mask=block < BLOCKS)


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """A static bound on sum_e ceil(count_e / block_m) over the experts that have pairs."""
    return pairs // block_m + min(num_experts, pairs)


def expert_layout(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_moe.pairs_by_expert` as one Triton launch (the same rows and experts)."""
    flat = topk_ids.reshape(-1).contiguous()  # [P]
    P = flat.numel()
    blocks_total = max_blocks(P, num_experts, block_m)
    rows = torch.empty(blocks_total * block_m, dtype=torch.int32, device=flat.device)
    experts = torch.empty(blocks_total, dtype=torch.int32, device=flat.device)
    _expert_layout_kernel[(1,)](flat, rows, experts, P, blocks_total, E=num_experts,
                                SPAN=triton.next_power_of_2(num_experts), BLOCK_M=block_m, CHUNK_=CHUNK,
                                FILL=256, num_warps=8)
    return rows, experts

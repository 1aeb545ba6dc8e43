"""Decode attention over Drama 3's slot KV cache: one query per row, each row reading only its
own slot's rows up to its position, the query heads of a key head together.

    out = cache_attention(q, keys, values, slots, positions)
    # q [B, H, Dh]; keys, values [S, R, Hkv, Dh] (the KVCache of every slot); slots, positions [B]
    # (int64; rows 0..position of the row's slot are visible) -> out [B, H, Dh] in q's dtype

Why: the step's attention (layers.attend) gathers the slot's rows up to the step's KV bucket
(`k[slots, :kv_len]`: a copy) and runs SDPA with a boolean mask over the whole bucket, one
bucket for every row of the step: the bucket of its furthest take. A retake with 4,000 rows
of history steps in the 4,096-row bucket, and so does every take decoding beside it.

Design choices:
- Split-K decoding (flash-decoding), as ring_attention.py: each program owns one (row, key
  head, split), runs an online softmax over its share of the row's rows in blocks of
  BLOCK_N, and writes its max, sum and weighted values; ring_attention's combine kernel
  merges the splits (the same partial layout). A row's splits follow its own length (one
  per SPLIT_ROWS rows, up to 16), never the batch: its sums, so a seeded take's frames, are
  the same alone and among 64 (the decoder's promise); splits it does not need exit at once.
- Grouped queries: the H / Hkv query heads of a key head (8 at the full size) are the rows
  of one `tl.dot` against each key block (padded to 16, the least a dot takes), so each key
  and value row is read once per step, not once per query head.
- Each row reads rows 0..position of its own slot straight from the cache: no gather, no
  mask over rows it cannot see, and a row's cost follows its own history, not the bucket.
- Scores and sums are float32; the dots take the cache's dtype (bfloat16 on the GPU).
- `cache_attention_reference` is the model's own path (the gather and layers.attend); tests
  hold the kernel to it (in Triton's interpreter on a CPU, and on the GPU).
"""

from __future__ import annotations

import math

import torch

from engine.drama3.layers import attend
from engine.kernels.fallback import guarded
from engine.kernels.ring_attention import INTERPRETED, MAX_SPLITS, combine_splits

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None

BLOCK_N = 32  # cache rows per block: a key and a value tile of 32 x 256 bfloat16, 16 KiB each
STAGES = 2  # software pipelining depth: 64 KiB of shared memory for the tiles (an SM has 228)
LEAST_DOT_ROWS = 16  # tl.dot's smallest M
SPLIT_ROWS = 128  # cache rows a split reads at least: 4,096 rows in 16 splits (the most), 300 in 3


def cache_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                              positions: torch.Tensor) -> torch.Tensor:
    """The model's path: the slots' rows up to the furthest position, `attend` with its mask."""
    rows = int(positions.max()) + 1
    out = attend(q[:, None], keys[slots, :rows], values[slots, :rows], positions[:, None])  # [B, 1, H, Dh]
    return out[:, 0]


if triton is not None:
    NEGATIVE = tl.constexpr(-1.0e30)  # a masked score: exp(NEGATIVE - m) is 0 for any real m

    @triton.jit
    def _block(first, stop, q, m, total, acc, k_base, v_base, stride_kr, stride_vr, sm_scale,
               DH: tl.constexpr, BLOCK: tl.constexpr, IEEE: tl.constexpr):
        """The online softmax of the head group over rows first .. first + BLOCK (those below `stop`)."""
        d = tl.arange(0, DH)
        n = first + tl.arange(0, BLOCK)  # [BLOCK]
        inside = n < stop
        k = tl.load(k_base + n[:, None] * stride_kr + d[None, :], mask=inside[:, None], other=0.0)  # [BLOCK, DH]
        v = tl.load(v_base + n[:, None] * stride_vr + d[None, :], mask=inside[:, None], other=0.0)
        if IEEE:
            score = tl.dot(q, tl.trans(k), input_precision="ieee")  # [G, BLOCK] float32
        else:
            score = tl.dot(q, tl.trans(k))
        score = tl.where(inside[None, :], score * sm_scale, NEGATIVE)
        new_m = tl.maximum(m, tl.max(score, 1))  # [G]
        alpha = tl.exp(m - new_m)
        p = tl.where(inside[None, :], tl.exp(score - new_m[:, None]), 0.0)  # [G, BLOCK]
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")  # [G, DH]
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return new_m, total * alpha + tl.sum(p, 1), acc

    @triton.jit
    def _split_kernel(
        q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, part_ptr, used_ptr,
        stride_qb, stride_qh, stride_ks, stride_kr, stride_kh, stride_vs, stride_vr, stride_vh,
        sm_scale,
        H: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, DH: tl.constexpr, SPLITS: tl.constexpr,
        BLOCK: tl.constexpr, IEEE: tl.constexpr, DYNAMIC: tl.constexpr, STATIC_BLOCKS: tl.constexpr,
        SPLIT_ROWS: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1).to(tl.int64)
        split = tl.program_id(2)
        d = tl.arange(0, DH)
        g = tl.arange(0, ROWS)  # the head group, padded to a dot's rows
        real = g < GROUP
        heads = kv_head * GROUP + g
        q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=real[:, None],
                    other=0.0)  # [ROWS, DH]
        slot = tl.load(slot_ptr + row).to(tl.int64)
        length = tl.load(pos_ptr + row) + 1  # rows 0..position
        used = tl.minimum(tl.cdiv(length, SPLIT_ROWS), SPLITS)  # the row's own, whatever the batch
        if split >= used:
            return
        if split == 0 and kv_head == 0:
            tl.store(used_ptr + row, used)
        share = tl.cdiv(tl.cdiv(length, used), BLOCK) * BLOCK
        start = split * share
        stop = tl.minimum(start + share, length)
        k_base = k_ptr + slot * stride_ks + kv_head * stride_kh
        v_base = v_ptr + slot * stride_vs + kv_head * stride_vh
        m = tl.zeros([ROWS], dtype=tl.float32) + NEGATIVE
        total = tl.zeros([ROWS], dtype=tl.float32)
        acc = tl.zeros([ROWS, DH], dtype=tl.float32)
        if DYNAMIC:  # on the GPU: only the blocks of the row's own rows
            for first in range(start, stop, BLOCK):
                m, total, acc = _block(first, stop, q, m, total, acc, k_base, v_base, stride_kr, stride_vr,
                                       sm_scale, DH, BLOCK, IEEE)
        else:  # Triton's interpreter cannot loop to a loaded bound: every block, masked
            for i in range(0, STATIC_BLOCKS):
                m, total, acc = _block(start + i * BLOCK, stop, q, m, total, acc, k_base, v_base, stride_kr,
                                       stride_vr, sm_scale, DH, BLOCK, IEEE)
        out = part_ptr + ((row * H + heads) * SPLITS + split) * (DH + 2)  # [ROWS] pointers
        tl.store(out[:, None] + d[None, :], acc, mask=real[:, None])
        tl.store(out + DH, m, mask=real)
        tl.store(out + DH + 1, total, mask=real)


def cache_attention_kernel(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                           positions: torch.Tensor) -> torch.Tensor:
    """`cache_attention_reference` as two Triton launches (no host sync: capturable)."""
    B, H, DH = q.shape
    _, R, HKV, _ = keys.shape
    assert values.shape == keys.shape and keys.shape[-1] == DH and H % HKV == 0 and slots.shape == positions.shape
    assert keys.stride(-1) == 1 and values.stride(-1) == 1 and q.stride(-1) == 1 and DH == triton.next_power_of_2(DH)
    group = H // HKV
    splits = MAX_SPLITS  # a row uses as many as its length needs (the kernel): the rest exit at once
    part = torch.empty(B, H, splits, DH + 2, dtype=torch.float32, device=q.device)
    used = torch.empty(B, dtype=torch.int32, device=q.device)
    out = torch.empty(B, H, DH, dtype=q.dtype, device=q.device)
    _split_kernel[(B, HKV, splits)](
        q, keys, values, slots, positions, part, used,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        1.0 / math.sqrt(DH),
        H=H, GROUP=group, ROWS=max(LEAST_DOT_ROWS, triton.next_power_of_2(group)), DH=DH, SPLITS=splits,
        BLOCK=BLOCK_N, IEEE=q.dtype == torch.float32, DYNAMIC=not INTERPRETED,
        STATIC_BLOCKS=triton.cdiv(R, BLOCK_N) if INTERPRETED else 0, SPLIT_ROWS=SPLIT_ROWS, num_warps=4,
        num_stages=STAGES,
    )
    combine_splits(part, used, out)
    return out


def _cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    if q.is_cuda and triton is not None:  # the reference from the kernel's first failure on this GPU on
        out = guarded("cache attention", cache_attention_kernel, cache_attention_reference, q, keys, values, slots,
                      positions)
    else:
        out = cache_attention_reference(q, keys, values, slots, positions)
    return out.contiguous()  # the layout the fake promises the compiled caller, whichever path ran


# The kernel on CUDA, the reference elsewhere, as one operator: torch.compile keeps it in the
# compiled layer's graph (an extern call) instead of breaking the graph around a Python call,
# which split each of the 23 compiled attention layers in two and multiplied the warm-up's compiles.
cache_attention = torch.library.custom_op(
    "retake::cache_attention", _cache_attention, mutates_args=(),
    schema="(Tensor q, Tensor keys, Tensor values, Tensor slots, Tensor positions) -> Tensor")


@cache_attention.register_fake
def _(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
      positions: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape)  # [B, H, Dh], contiguous

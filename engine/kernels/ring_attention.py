"""Decode attention over a ring of past keys and values: one query per row, float8 or bfloat16 ring.

    out = ring_attention(q, keys, values, key_scales, value_scales, positions, context, active)
    # q [B, H, Dh]; keys, values [B, H, C, Dh] (float8_e4m3fn with float32 scales [B, H, C],
    # or any float dtype with scales None); positions [B] (int64); active [B] bool or None
    # -> out [B, H, Dh] in q's dtype, zero in the rows not active

The ring is PersonaPlex's (engine/personaplex/ring.py): position p lives in slot p % C,
and the position slot j holds is recomputed from the query's own position q:
held = q - ((q - j) mod C). A slot is visible when held >= 0 and q - held < context, or
when it is the query's own (held == q, which keeps a row at position -1 defined).

Design choices:
- Split-K decoding (flash-decoding): each program owns one (row, head, split) and runs an
  online softmax over its share of the ring in blocks of BLOCK_N slots, writing its max,
  sum and weighted values; a second kernel combines the splits. A row's splits follow its
  own history, one per SPLIT_SLOTS slots up to MAX_SPLITS (a full ring of 3,000 in 12, so
  a lone conversation still spreads over the GPU's SMs), never the batch: a row's sums,
  so its draws, are the same alone and among 128 (sampling.py's promise). The grid holds
  MAX_SPLITS per (row, head); the splits a row does not need exit at once and write
  nothing, and the combine reads the ones it used.
- Only the slots a row has written are read: before the ring wraps a row at position q
  has slots 0..q, so a young conversation costs what its history holds, not the whole
  ring; a row at position -1 (a slot between conversations) reads its own slot only.
- Float8 keys and values are read as they are stored (one byte each); a slot's scale
  multiplies its dot product and its softmax weight, not every element: the memory
  traffic, which is what a decode step costs, is half of bfloat16's, and the CUDA cores do
  a convert and a multiply-add per element. Scores, softmax and sums are float32.
- Float8 rings on the CUDA cores by default: a slot's key and value converted to float32 and
  reduced across the threads. A tensor-core form (`_block_dots`, `dots=True`: the query padded
  to 16 rows against a block's keys, the weights against its values, two float16 `tl.dot`s)
  was written to halve the reduction work, and measured slower on the H200 (`retake bench
  kernels`, 2026-12-05, one layer over full rings): 0.0314 / 0.1618 / 1.2404 ms at 1 / 8 /
  64 conversations against 0.0231 / 0.1172 (CUDA cores) at 1 / 8, and the 64- and
  128-conversation ticks rose from 42.7 / 72.9 ms (stop 31, CUDA cores) to 53.3 / 95.4. It
  stays selectable for the bench and its tests (held to the reference at 2e-3: float8 to
  float16 is exact, the weights times the value scales are rounded to float16's 11 bits).
- Two warps a program over 64-slot blocks (`retake bench kernels`, H200, 2026-12-05, one
  layer over full float8 rings, ms at 1 / 8 / 64 conversations): 0.0197 / 0.0715 / 0.4874
  (1.2x the bytes' floor at 64), against four warps' 0.0229 / 0.1162 / 0.8819 and 128-slot
  blocks with four warps' 0.0174 / 0.0847 / 0.5883. A program's [64, Dh] float32 key and
  value tiles spread over fewer threads cost registers, not bandwidth: more programs stay
  resident, more loads are in flight.
- Rows not `active` (slots a tick holds: nothing of their tick is kept, engine/personaplex/
  lockstep.py) read nothing and give zeros: with ticks as frames arrive a tick hears a
  part of its batch, and at 128 conversations with full rings this kernel was 54.2 ms
  of a 72.9 ms tick, all rows read.
- Masked scores are a large finite negative number, not -inf, so a block (or a split)
  with nothing visible adds exactly zero instead of NaN.
- `ring_attention_reference` is the plain-torch definition; tests hold the kernel to it
  (in Triton's interpreter on a CPU, and on the GPU).
"""

from __future__ import annotations

import math
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None

BLOCK_N = 64  # ring slots per block
WARPS = 2  # per program (the design choices: measured against 4 and 8)
MAX_SPLITS = 16
SPLIT_SLOTS = 256  # ring slots a split reads at least: a full ring of 3,000 in 12 splits, a young one in 1
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)


# ─── torch reference ─────────────────────────────────────────────────────────


def visible_slots(positions: torch.Tensor, capacity: int, context: int) -> torch.Tensor:
    """bool [B, C]: which ring slots a query at positions [B] sees."""
    q = positions[:, None]  # [B, 1]
    slots = torch.arange(capacity, device=positions.device)
    held = q - torch.remainder(q - slots, capacity)  # [B, C]
    return ((held >= 0) & (q - held < context)) | (held == q)


def ring_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             key_scales: torch.Tensor | None, value_scales: torch.Tensor | None,
                             positions: torch.Tensor, context: int, active: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, Dh], ring [B, H, C, Dh] (+ scales [B, H, C]), positions [B], active [B] or None ->
    [B, H, Dh] in q's dtype (zeros in rows not active)."""
    k, v = keys.float(), values.float()
    if key_scales is not None and value_scales is not None:
        k, v = k * key_scales[..., None], v * value_scales[..., None]
    scores = torch.einsum("bhd,bhcd->bhc", q.float(), k) / math.sqrt(q.shape[-1])  # [B, H, C]
    visible = visible_slots(positions, keys.shape[2], context)[:, None]  # [B, 1, C]
    weights = torch.softmax(scores.masked_fill(~visible, -torch.inf), dim=-1)
    v = torch.where(visible[..., None], v, 0)  # a hidden slot's weight is 0, and 0 * NaN is NaN (ring.py)
    out = torch.einsum("bhc,bhcd->bhd", weights, v)  # [B, H, Dh]
    return (out if active is None else torch.where(active[:, None, None], out, 0)).to(q.dtype)


# ─── Triton ──────────────────────────────────────────────────────────────────

if triton is not None:
    NEGATIVE = tl.constexpr(-1.0e30)  # a masked score: exp(NEGATIVE - m) is 0 for any real m, NEGATIVE - NEGATIVE 0

    @triton.jit
    def _block(first, stop, position, capacity, context, sm_scale, q, m, total, acc,
               k_row, v_row, ks_row, vs_row, stride_kc, stride_vc,
               DH: tl.constexpr, BLOCK: tl.constexpr, HAS_SCALE: tl.constexpr):
        """The online softmax over ring slots first .. first + BLOCK (those below `stop`)."""
        d = tl.arange(0, DH)
        slot = first + tl.arange(0, BLOCK)  # [BLOCK]
        inside = slot < stop
        held = position - (position - slot + capacity) % capacity  # position >= -1, slot < C
        seen = inside & (((held >= 0) & (position - held < context)) | (held == position))
        k = tl.load(k_row + slot[:, None] * stride_kc + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_row + slot[:, None] * stride_vc + d[None, :], mask=inside[:, None], other=0.0).to(tl.float32)
        # A slot's scale multiplies its score and its weight ([BLOCK]), not its key and value
        # ([BLOCK, DH]): the same sums, a multiply less per element read (at 128 conversations the
        # kernel converts and multiplies ~100 GB of float8 a tick on the CUDA cores).
        dots = tl.sum(k * q[None, :], 1) * sm_scale  # [BLOCK]
        if HAS_SCALE:
            dots = dots * tl.load(ks_row + slot, mask=inside, other=0.0)
        score = tl.where(seen, dots, NEGATIVE)
        new_m = tl.maximum(m, tl.max(score, 0))
        alpha = tl.exp(m - new_m)
        p = tl.where(seen, tl.exp(score - new_m), 0.0)
        weight = p  # [BLOCK]
        if HAS_SCALE:
            weight = p * tl.load(vs_row + slot, mask=inside, other=0.0)
        return new_m, total * alpha + tl.sum(p, 0), acc * alpha + tl.sum(weight[:, None] * v, 0)

    @triton.jit
    def _block_dots(first, stop, position, capacity, context, sm_scale, q16, m, total, acc,
                    k_row, v_row, ks_row, vs_row, stride_kc, stride_vc,
                    DH: tl.constexpr, BLOCK: tl.constexpr):
        """`_block` on tensor cores, float8 ring: q16 [16, DH] float16 (row 0 the query, the rest
        zero), m and total [16], acc [16, DH]; every row computes, row 0 is the answer."""
        d = tl.arange(0, DH)
        slot = first + tl.arange(0, BLOCK)  # [BLOCK]
        inside = slot < stop
        held = position - (position - slot + capacity) % capacity
        seen = inside & (((held >= 0) & (position - held < context)) | (held == position))
        k = tl.load(k_row + slot[:, None] * stride_kc + d[None, :], mask=inside[:, None], other=0.0)  # [BLOCK, DH]
        v = tl.load(v_row + slot[:, None] * stride_vc + d[None, :], mask=inside[:, None], other=0.0)
        key_scale = tl.load(ks_row + slot, mask=inside, other=0.0)  # [BLOCK]
        value_scale = tl.load(vs_row + slot, mask=inside, other=0.0)
        dots = tl.dot(q16, tl.trans(k.to(tl.float16)))  # [16, BLOCK] float32
        score = tl.where(seen[None, :], dots * (key_scale * sm_scale)[None, :], NEGATIVE)
        new_m = tl.maximum(m, tl.max(score, 1))  # [16]
        alpha = tl.exp(m - new_m)
        p = tl.where(seen[None, :], tl.exp(score - new_m[:, None]), 0.0)  # [16, BLOCK]
        weight = (p * value_scale[None, :]).to(tl.float16)
        return new_m, total * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(weight, v.to(tl.float16))

    @triton.jit
    def _split_kernel(
        q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, pos_ptr, active_ptr, part_ptr, used_ptr,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kc, stride_vb, stride_vh, stride_vc,
        stride_sb, stride_sh, stride_tb, stride_th,
        capacity, context, sm_scale,
        H: tl.constexpr, DH: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr, HAS_SCALE: tl.constexpr,
        DYNAMIC: tl.constexpr, STATIC_BLOCKS: tl.constexpr, DOTS: tl.constexpr = False,
        HAS_ACTIVE: tl.constexpr = False, SPLIT_SLOTS: tl.constexpr = 256,
    ):
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        split = tl.program_id(2)
        d = tl.arange(0, DH)
        q = tl.load(q_ptr + row * stride_qb + head * stride_qh + d).to(tl.float32)  # [DH]
        position = tl.load(pos_ptr + row)
        # The written slots: 0..min(q, C - 1) from position 0 on; at -1 only the last (its own).
        lo = tl.where(position >= 0, 0, capacity - 1)
        hi = tl.where(position >= 0, tl.minimum(position + 1, capacity), capacity)
        if HAS_ACTIVE:  # a held row: an empty range, so its one split writes an empty softmax (zeros)
            hi = tl.where(tl.load(active_ptr + row) != 0, hi, lo)
        # The row's splits follow its own length, not the batch: its sums are the same in any batch.
        used = tl.minimum(tl.maximum(tl.cdiv(hi - lo, SPLIT_SLOTS), 1), SPLITS)
        if split >= used:
            return
        if split == 0 and head == 0:
            tl.store(used_ptr + row, used)
        share = tl.cdiv(tl.cdiv(hi - lo, used), BLOCK) * BLOCK
        start = lo + split * share
        stop = tl.minimum(start + share, hi)
        k_row = k_ptr + row * stride_kb + head * stride_kh
        v_row = v_ptr + row * stride_vb + head * stride_vh
        ks_row = ks_ptr + row * stride_sb + head * stride_sh
        vs_row = vs_ptr + row * stride_tb + head * stride_th
        out = part_ptr + ((row * H + head) * SPLITS + split) * (DH + 2)
        if DOTS:  # float8 ring, tensor cores: 16 query rows (the first real) against each block
            lane = tl.arange(0, 16)
            q16 = tl.where(lane[:, None] == 0, q[None, :], 0.0).to(tl.float16)  # [16, DH]
            m16 = tl.zeros([16], dtype=tl.float32) + NEGATIVE
            total16 = tl.zeros([16], dtype=tl.float32)
            acc16 = tl.zeros([16, DH], dtype=tl.float32)
            if DYNAMIC:
                for first in range(start, stop, BLOCK):
                    m16, total16, acc16 = _block_dots(first, stop, position, capacity, context, sm_scale, q16, m16,
                                                      total16, acc16, k_row, v_row, ks_row, vs_row, stride_kc,
                                                      stride_vc, DH, BLOCK)
            else:
                for i in range(0, STATIC_BLOCKS):
                    m16, total16, acc16 = _block_dots(start + i * BLOCK, stop, position, capacity, context, sm_scale,
                                                      q16, m16, total16, acc16, k_row, v_row, ks_row, vs_row,
                                                      stride_kc, stride_vc, DH, BLOCK)
            first_row = (lane == 0)[:, None]
            tl.store(out + d, tl.sum(tl.where(first_row, acc16, 0.0), 0))
            tl.store(out + DH, tl.max(tl.where(lane == 0, m16, NEGATIVE), 0))
            tl.store(out + DH + 1, tl.sum(tl.where(lane == 0, total16, 0.0), 0))
            return
        zero = position.to(tl.float32) * 0.0  # loop-carried scalars start as float32 tensors, not constants
        m = zero + NEGATIVE
        total = zero
        acc = tl.zeros([DH], dtype=tl.float32)
        if DYNAMIC:  # on the GPU: only the blocks this row has written
            for first in range(start, stop, BLOCK):
                m, total, acc = _block(first, stop, position, capacity, context, sm_scale, q, m, total, acc,
                                       k_row, v_row, ks_row, vs_row, stride_kc, stride_vc, DH, BLOCK, HAS_SCALE)
        else:  # Triton's interpreter cannot loop to a loaded bound: every block, masked
            for i in range(0, STATIC_BLOCKS):
                m, total, acc = _block(start + i * BLOCK, stop, position, capacity, context, sm_scale, q, m, total,
                                       acc, k_row, v_row, ks_row, vs_row, stride_kc, stride_vc, DH, BLOCK,
                                       HAS_SCALE)
        tl.store(out + d, acc)
        tl.store(out + DH, m)
        tl.store(out + DH + 1, total)

    @triton.jit
    def _combine_kernel(part_ptr, used_ptr, out_ptr, stride_ob, stride_oh,
                        H: tl.constexpr, DH: tl.constexpr, SPLITS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        d = tl.arange(0, DH)
        s = tl.arange(0, SPLITS)
        live = s < tl.load(used_ptr + row)  # the splits the row used (the others wrote nothing)
        base = part_ptr + (row * H + head) * SPLITS * (DH + 2)
        m = tl.load(base + s * (DH + 2) + DH, mask=live, other=NEGATIVE)  # [SPLITS]
        total = tl.load(base + s * (DH + 2) + DH + 1, mask=live, other=0.0)
        acc = tl.load(base + s[:, None] * (DH + 2) + d[None, :], mask=live[:, None], other=0.0)  # [SPLITS, DH]
        weight = tl.exp(m - tl.max(m, 0))
        denominator = tl.sum(total * weight, 0)
        value = tl.sum(acc * weight[:, None], 0) / tl.where(denominator > 0, denominator, 1.0)
        tl.store(out_ptr + row * stride_ob + head * stride_oh + d, value.to(out_ptr.dtype.element_ty))


def ring_attention_kernel(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          key_scales: torch.Tensor | None, value_scales: torch.Tensor | None,
                          positions: torch.Tensor, context: int, active: torch.Tensor | None = None,
                          block: int = BLOCK_N, warps: int = WARPS, dots: bool = False) -> torch.Tensor:
    """`ring_attention_reference` as two Triton launches (no host sync: capturable); `block` ring
    slots per step and `warps` per program, a float8 ring on tensor cores if `dots` (slower on
    the H200; `retake bench kernels` times the choices)."""
    B, H, C, DH = keys.shape
    assert q.shape == (B, H, DH) and values.shape == keys.shape and positions.shape == (B,)
    assert keys.stride(-1) == 1 and values.stride(-1) == 1 and q.stride(-1) == 1 and DH == triton.next_power_of_2(DH)
    splits = MAX_SPLITS  # a row uses as many as its length needs (the kernel): the rest exit at once
    part = torch.empty(B, H, splits, DH + 2, dtype=torch.float32, device=q.device)
    used = torch.empty(B, dtype=torch.int32, device=q.device)
    out = torch.empty(B, H, DH, dtype=q.dtype, device=q.device)
    has_scale = key_scales is not None
    ks = key_scales if key_scales is not None else part  # unused when not has_scale
    vs = value_scales if value_scales is not None else part
    _split_kernel[(B, H, splits)](
        q, keys, values, ks, vs, positions, active if active is not None else positions, part, used,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
        C, context, 1.0 / math.sqrt(DH),
        H=H, DH=DH, SPLITS=splits, BLOCK=block, HAS_SCALE=has_scale, DYNAMIC=not INTERPRETED,
        STATIC_BLOCKS=triton.cdiv(C, block) if INTERPRETED else 0, SPLIT_SLOTS=SPLIT_SLOTS,
        DOTS=dots and has_scale and DH >= 16, HAS_ACTIVE=active is not None, num_warps=warps,
    )
    combine_splits(part, used, out)
    return out


def combine_splits(part: torch.Tensor, used: torch.Tensor, out: torch.Tensor) -> None:
    """The splits' partial softmaxes part [B, H, SPLITS, Dh + 2] (weighted values, max, sum), the
    first used[b] of them written for row b, into out [B, H, Dh]: one launch (cache_attention.py
    uses it too). Unused splits add exact zeros, so a row's result does not depend on SPLITS."""
    B, H, splits, width = part.shape
    _combine_kernel[(B, H)](part, used, out, out.stride(0), out.stride(1), H=H, DH=width - 2, SPLITS=splits,
                            num_warps=1)


def ring_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   key_scales: torch.Tensor | None, value_scales: torch.Tensor | None,
                   positions: torch.Tensor, context: int, active: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel on CUDA, the reference elsewhere."""
    run = ring_attention_kernel if q.is_cuda and triton is not None else ring_attention_reference
    return run(q, keys, values, key_scales, value_scales, positions, context, active)

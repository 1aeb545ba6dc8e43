"""The top 32 of a logits row in two parallel steps: many programs per row rank a chunk
each, one program per row merges their lists. The sampler's building block (sampler.py).

    chunks = top_chunks(logits, offset, width, temperatures)   # launch 1: grid (B, CHUNKS)
    top = merge_chunks(keys [CHUNKS, 32])                       # inside launch 2: [32], descending

Each logit becomes an int64 key (its float32 bits made order-preserving, then the
complement of its index): every key is distinct and equal logits rank by index, as a
stable descending sort does. Besides its 32 best keys, a chunk reports its largest logit,
its share of the softmax normaliser for one or two temperatures, and how many of its
logits are not finite, so the merging program never reads the row again.

Design choices:
- Chunks of 256 (16 per 4,096-wide row) instead of one program sorting the whole row: a
  bitonic sort of 4,096 int64 keys in one program runs ~80 compare-exchange passes over
  the whole block (shuffles through shared memory, spilled registers); 16 programs with
  256 keys each run on 16 SMs in parallel and the merge works on 16 x 32 keys.
- A chunk stores its 32 keys ascending when its index is even and descending when odd, so
  the merge is the second half of a bitonic top-k: the elementwise max of an ascending and
  a descending list is a bitonic sequence that holds their best 32, and five
  compare-exchange passes sort it (in the alternating direction its next pairing needs).
  Partner elements come from an xor-reduction over a size-2 axis (no register gather).
- A chunk's normaliser share is sum(exp(x / t - m / t)) with m its largest logit (float64);
  the merger rescales each share by exp(m / t - top). Empty or all -inf chunks give 0.
- Padding keys are int64's minimum: below every real key, so they sink to the end.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the torch references run there
    triton = None
    tl = None

SELECT = 32  # keys kept per chunk and after the merge (a power of two)
CHUNK = 256  # logits per program at full width
PAD_KEY = -(2**63)


def chunk_size(width: int) -> int:
    """Logits per chunk for rows `width` wide: 256, or less for narrow rows (at least SELECT,
    and at least two chunks where the row allows, so the merge always runs)."""
    pow2 = 1 << max(0, width - 1).bit_length()
    return max(SELECT, min(CHUNK, pow2 // 4))


def chunk_count(width: int) -> int:
    """Chunks per row: a power of two (the merge pairs them), the last ones maybe empty."""
    count = -(-width // chunk_size(width))
    return 1 << max(0, count - 1).bit_length()


if triton is not None:

    @triton.jit
    def keys_of(x, index, SPAN: tl.constexpr):
        """int64 keys that sort float32 x descending, lower index first among equal values."""
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 and 0.0 are one value, as for torch.sort
        bits = x.to(tl.int32, bitcast=True)
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order of the bits = float order
        return (ordered.to(tl.int64) << 32) | (SPAN - 1 - index).to(tl.int64)

    @triton.jit
    def key_value(key):
        ordered = (key >> 32).to(tl.int32)
        return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    @triton.jit
    def key_index(key, SPAN: tl.constexpr):
        return SPAN - 1 - (key & 0xFFFFFFFF).to(tl.int32)

    @triton.jit
    def _xor(a, b):
        return a ^ b

    @triton.jit
    def _bitonic_merge(x, descending, LOG_K: tl.constexpr):
        """Sort each row of x [GROUPS, K = 2**LOG_K] (each a bitonic sequence); descending
        [GROUPS, 1] (bool) gives each row's direction."""
        GROUPS: tl.constexpr = x.shape[0]
        K: tl.constexpr = x.shape[1]
        flip = tl.reshape(descending, (GROUPS, 1, 1, 1))
        for step in tl.static_range(LOG_K):
            # partners are (K / 2) >> step apart: blocks of twice that, 1 << step of them per row
            h = tl.reshape(x, (GROUPS, 1 << step, 2, (K // 2) >> step))
            partner = h ^ tl.reduce(h, 2, _xor, keep_dims=True)  # the element across the size-2 axis
            right = tl.reshape(tl.arange(0, 2), (1, 1, 2, 1)) == 1
            # ascending rows keep the smaller on the left, descending ones the larger
            h = tl.where((h > partner) != (flip ^ right), partner, h)
            x = tl.reshape(h, (GROUPS, K))
        return x

    @triton.jit
    def merge_chunks(keys, LOG_CHUNKS: tl.constexpr, LOG_K: tl.constexpr):
        """The best K keys [K], descending, of keys [2**LOG_CHUNKS, K = 2**LOG_K] (row c
        ascending for even c, descending for odd c; a single row: descending)."""
        K: tl.constexpr = keys.shape[1]
        for level in tl.static_range(LOG_CHUNKS):
            # (constexpr sizes inline: Triton does not let a loop reassign a constexpr)
            keys = tl.max(tl.reshape(keys, (keys.shape[0] // 2, 2, K)), 1)  # [pairs, K]: bitonic, their best K
            parity = (tl.arange(0, keys.shape[0]) % 2 == 1) | (level == LOG_CHUNKS - 1)  # odd rows, the last: down
            keys = _bitonic_merge(keys, tl.reshape(parity, (keys.shape[0], 1)), LOG_K)
        return tl.reshape(keys, (K,))

    @triton.jit
    def _top_chunks_kernel(
        logits_ptr, stride_row, offset,  # [B, offset + N] float; the ranked columns start at offset
        temperature_ptr, second_temperature,  # float32 [B]; a fixed second temperature (TWO)
        keys_ptr, max_ptr, share_ptr, bad_ptr,  # [B, CHUNKS, K] int64, [B, CHUNKS] f32, [B, CHUNKS, 2] f64, i32
        N: tl.constexpr, SPAN: tl.constexpr, CHUNK_: tl.constexpr, CHUNKS: tl.constexpr, K: tl.constexpr,
        TWO: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        index = chunk * CHUNK_ + tl.arange(0, CHUNK_)
        valid = index < N
        x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offset + index, mask=valid,
                    other=-float("inf")).to(tl.float32)
        keys = tl.where(valid, keys_of(x, index, SPAN), -9223372036854775807 - 1)
        top = tl.topk(keys, K)  # [K], descending
        slot = tl.arange(0, K)
        ascending = (chunk % 2 == 0) & (CHUNKS > 1)
        slot = tl.where(ascending, K - 1 - slot, slot)
        at = row * CHUNKS + chunk
        tl.store(keys_ptr + at * K + slot, top)
        m = tl.max(x, 0)
        tl.store(max_ptr + at, m)
        m64 = tl.where(m == -float("inf"), 0.0, m).to(tl.float64)  # an all -inf chunk: its terms are 0
        live = valid & (x != -float("inf"))
        t = tl.maximum(tl.load(temperature_ptr + row), 1e-5).to(tl.float64)
        x64 = x.to(tl.float64)
        tl.store(share_ptr + at * 2, tl.sum(tl.where(live, tl.exp(x64 / t - m64 / t), 0.0), 0))
        if TWO:
            t2 = tl.maximum(second_temperature, 1e-5).to(tl.float64)
            tl.store(share_ptr + at * 2 + 1, tl.sum(tl.where(live, tl.exp(x64 / t2 - m64 / t2), 0.0), 0))
        bad = valid & ((x != x) | (tl.abs(x) == float("inf")))
        tl.store(bad_ptr + at, tl.sum(bad.to(tl.int32), 0))


def top_chunks(logits: torch.Tensor, offset: int, width: int, temperature: torch.Tensor,
               second_temperature: float | None = None) -> tuple[torch.Tensor, ...]:
    """Launch 1: per row of logits [B, offset + width] (columns offset.. ranked), per chunk:
    keys int64 [B, CHUNKS, 32], largest logit f32 [B, CHUNKS], normaliser shares f64
    [B, CHUNKS, 2] (temperature [B], and second_temperature if given), non-finite counts
    int32 [B, CHUNKS]."""
    B = logits.shape[0]
    assert logits.stride(-1) == 1 and logits.shape[1] == offset + width
    chunk, chunks = chunk_size(width), chunk_count(width)
    device = logits.device
    keys = torch.empty(B, chunks, SELECT, dtype=torch.long, device=device)
    maxes = torch.empty(B, chunks, dtype=torch.float32, device=device)
    shares = torch.empty(B, chunks, 2, dtype=torch.float64, device=device)  # [.., 1] only written with TWO
    bad = torch.empty(B, chunks, dtype=torch.int32, device=device)
    span = 1 << max(0, width - 1).bit_length()
    _top_chunks_kernel[(B, chunks)](
        logits, logits.stride(0), offset, temperature,
        1.0 if second_temperature is None else second_temperature, keys, maxes, shares, bad,
        N=width, SPAN=max(span, SELECT), CHUNK_=chunk, CHUNKS=chunks, K=SELECT, TWO=second_temperature is not None,
        num_warps=2,
    )
    return keys, maxes, shares, bad

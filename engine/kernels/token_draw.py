"""PersonaPlex's token draw as one Triton launch per call, after one sort: top-k Gumbel-max.

    tokens = draw_kernel(logits, temperature, top_k, seed, counter, stream)   # [B] int64

The definition is `engine.personaplex.sampling.draw_reference`: among the logits >= the
row's k-th largest, argmax(logits / T + Gumbel noise), the noise counter-based
(draws.py: Philox keyed by the row's seed, its counter, the stream and the candidate's
id); a temperature of 0 takes the argmax of the logits.

Design choices:
- A row that fits one block (an audio codebook's 2,048 logits: the depformer's eight or
  sixteen draws a tick) is drawn by one launch and nothing else: the program holds the
  row in registers, finds its k-th largest logit by bisection over the logits' order-
  preserving integer keys (32 counts over the row, any top_k per row, exact), then draws.
  On the H200 each of those draws was a torch sort of ~22 us before it (radix sort, its
  gather; 9 of them 0.42 ms of a 10.7 ms tick at one conversation, 0.63 ms at 128).
- A longer row (the text vocabulary, 32,000) takes its k-th largest logit from one torch
  sort, and the kernel does the rest in one pass over the row: the noise for every
  candidate (hundreds of small integer ops in torch, each a launch), the division, the
  mask and both argmaxes.
- Scores are float64, as in the reference, so kernel and reference pick the same token
  except on an exact tie of two float64 scores. Ties go to the lower id, as torch's argmax.
- One program per row, the row in blocks of BLOCK: the text vocabulary (32,000) is a
  loop of 32 blocks, an audio codebook (2,048) two.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    from engine.kernels.draws import gumbel
except ImportError:  # CPU installs have no Triton
    triton = None
    tl = None

BLOCK = 1024
ROW_BLOCK = 4096  # the longest row drawn from registers, its k-th largest found in the kernel

if triton is not None:

    @triton.jit
    def _draw_kernel(logits_ptr, kth_ptr, temperature_ptr, seed_ptr, counter_ptr, out_ptr, stride, stream,
                     V: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        kth = tl.load(kth_ptr + row)
        temperature = tl.load(temperature_ptr + row)
        t = tl.where(temperature > 0, temperature, 1.0).to(tl.float64)
        seed = tl.load(seed_ptr + row)
        counter = tl.load(counter_ptr + row)
        zero = temperature * 0.0  # loop-carried scalars start as tensors of their types, not constants
        best_score = zero.to(tl.float64) - float("inf")
        best = zero.to(tl.int32)
        top_logit = zero - float("inf")
        top = zero.to(tl.int32)
        for first in range(0, V, BLOCK):
            index = first + tl.arange(0, BLOCK)
            inside = index < V
            x = tl.load(logits_ptr + row * stride + index, mask=inside, other=-float("inf"))
            score = tl.where(inside & (x >= kth), x.to(tl.float64) / t + gumbel(seed, counter, stream, index),
                             -float("inf"))
            block_best = tl.max(score, 0)
            block_index = first + tl.argmax(score, 0)
            better = block_best > best_score  # strictly: an earlier block wins a tie
            best = tl.where(better, block_index, best)
            best_score = tl.where(better, block_best, best_score)
            block_top = tl.max(x, 0)
            higher = block_top > top_logit
            top = tl.where(higher, first + tl.argmax(x, 0), top)
            top_logit = tl.where(higher, block_top, top_logit)
        tl.store(out_ptr + row, tl.where(temperature > 0, best, top).to(tl.int64))


    @triton.jit
    def _draw_row_kernel(logits_ptr, top_k_ptr, temperature_ptr, seed_ptr, counter_ptr, out_ptr, stride, stream,
                         V: tl.constexpr, BLOCK: tl.constexpr):
        """A row of at most BLOCK logits: its k-th largest by bisection, then the draw."""
        row = tl.program_id(0).to(tl.int64)
        index = tl.arange(0, BLOCK)
        inside = index < V
        x = tl.load(logits_ptr + row * stride + index, mask=inside, other=-float("inf"))  # [BLOCK]
        # Order-preserving keys: a float's bits, the negative ones' magnitude bits flipped (so
        # keys compare as the floats do); -0.0 + 0.0 is +0.0, so the two zeros share a key.
        bits = (x + 0.0).to(tl.int32, bitcast=True)
        key = tl.where(inside, bits ^ ((bits >> 31) & 0x7FFFFFFF), -2147483648).to(tl.int64)
        k = tl.minimum(tl.maximum(tl.load(top_k_ptr + row), 1), V)
        # The k-th largest key: the largest t with count(key >= t) >= k (it is one of the keys).
        lo = tl.min(key, 0)
        hi = tl.max(key, 0)
        for _ in range(32):  # the keys span at most 2**32 values: 32 halvings close [lo, hi]
            mid = lo + (hi - lo + 1) // 2
            enough = tl.sum((key >= mid).to(tl.int32), 0) >= k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid - 1)
        temperature = tl.load(temperature_ptr + row)
        t = tl.where(temperature > 0, temperature, 1.0).to(tl.float64)
        seed = tl.load(seed_ptr + row)
        counter = tl.load(counter_ptr + row)
        score = tl.where(inside & (key >= lo), x.to(tl.float64) / t + gumbel(seed, counter, stream, index),
                         -float("inf"))
        best = tl.argmax(score, 0)  # ties to the lower id, as torch's argmax
        top = tl.argmax(x, 0)
        tl.store(out_ptr + row, tl.where(temperature > 0, best, top).to(tl.int64))


def draw_kernel(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, seed: torch.Tensor,
                counter: torch.Tensor, stream: int) -> torch.Tensor:
    """`draw_reference` as one Triton launch for a row of at most ROW_BLOCK logits, else a sort
    and one launch (no host sync either way: capturable)."""
    B, V = logits.shape
    logits = logits.float().contiguous()
    if V <= ROW_BLOCK:
        out = torch.empty(B, dtype=torch.long, device=logits.device)
        _draw_row_kernel[(B,)](logits, top_k.contiguous(), temperature.float().contiguous(), seed.contiguous(),
                               counter.contiguous(), out, logits.stride(0), stream, V=V,
                               BLOCK=triton.next_power_of_2(V), num_warps=8)
        return out
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, (top_k.clamp(1, V) - 1)[:, None])[:, 0]  # [B]
    out = torch.empty(B, dtype=torch.long, device=logits.device)
    _draw_kernel[(B,)](logits, kth.contiguous(), temperature.float().contiguous(), seed.contiguous(),
                       counter.contiguous(), out, logits.stride(0), stream, V=V, BLOCK=BLOCK, num_warps=4)
    return out

"""MoE routing in one launch: router logits -> softmax -> top k experts -> renormalised weights.

    experts, weights = route(router_logits, k)   # [N, k] int64 (most probable first), [N, k] float32

The reference is engine/drama3/moe.py's `top_experts` (softmax, topk, renormalise); on
CUDA the Triton kernel replaces its ~6 launches per layer (softmax, topk's gather and
sort, sum, divide) with one, for any row count (a decode step has 1..64).

Design choices:
- One program per row: a router row is 256 logits, a few registers per thread of one warp.
- The top k come from k rounds of a max over int64 keys (the logit's float32 bits made
  order-preserving, then the complement of its index, as the sampler's keys): one
  reduction per round yields value and index together, every key is distinct, and equal
  logits rank by lower index. Ranking by logit is ranking by probability (softmax is
  monotone) without the rounding that can make two probabilities equal.
- The experts come out most probable first, as torch.topk gives them: the FP8 expert
  kernel's "pairs" layout keeps that order and its combine sums the pairs in it, so
  kernel and reference feed the experts the same way.
- The weights are the softmax probabilities (float32, max-subtracted) of the chosen
  experts divided by their sum, the reference's arithmetic (only the reduction order of
  the softmax's sum differs: ~1e-7 relative).
"""

from __future__ import annotations

import torch

from engine.drama3.moe import top_experts
from engine.kernels.fallback import guarded

try:
    import triton
    import triton.language as tl

    from engine.kernels.top_keys import key_index, keys_of
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None


def route_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> experts [N, k] and weights [N, k]: moe.py's definition."""
    return top_experts(logits, k)


if triton is not None:

    @triton.jit
    def _route_kernel(
        logits_ptr, stride_row,  # [N, E] float (a row may be a view of a wider packed projection)
        experts_ptr, weights_ptr,  # [N, K] int64, [N, K] float32
        E: tl.constexpr, SPAN: tl.constexpr, K: tl.constexpr, SLOTS: tl.constexpr,  # SLOTS: K to a power of two
    ):
        row = tl.program_id(0)
        index = tl.arange(0, SPAN)
        valid = index < E
        x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + index, mask=valid,
                    other=-float("inf")).to(tl.float32)
        exps = tl.where(valid, tl.exp(x - tl.max(x, 0)), 0.0)
        probs = exps / tl.sum(exps, 0)  # [SPAN]
        keys = tl.where(valid, keys_of(x, index, SPAN), -9223372036854775807 - 1)
        slot = tl.arange(0, SLOTS)
        used = slot < K
        chosen = tl.zeros((SLOTS,), dtype=tl.int32)
        for j in tl.static_range(K):
            best = tl.max(keys, 0)  # the most probable expert left: its logit and index in one key
            chosen = tl.where(slot == j, key_index(best, SPAN), chosen)
            keys = tl.where(keys == best, -9223372036854775807 - 1, keys)
        # each chosen expert's probability, picked out of the row
        picked = (index[None, :] == chosen[:, None]) & used[:, None]
        weights = tl.sum(tl.where(picked, probs[None, :], 0.0), 1)  # [SLOTS], 0 past K
        tl.store(experts_ptr + row * K + slot, chosen.to(tl.int64), mask=used)
        tl.store(weights_ptr + row * K + slot, weights / tl.sum(weights, 0), mask=used)


def route_kernel(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_reference` as one Triton launch (one program per row)."""
    N, E = logits.shape
    assert logits.stride(-1) == 1 and 1 <= k <= E
    experts = torch.empty(N, k, dtype=torch.long, device=logits.device)
    weights = torch.empty(N, k, dtype=torch.float32, device=logits.device)
    if N:
        _route_kernel[(N,)](logits, logits.stride(0), experts, weights, E=E,
                            SPAN=1 << max(0, E - 1).bit_length(), K=k, SLOTS=1 << max(0, k - 1).bit_length(),
                            num_warps=1)
    return experts, weights


def _route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda and triton is not None:  # the reference from the kernel's first failure on this GPU on
        return guarded("MoE routing", route_kernel, route_reference, logits, k)
    experts, weights = route_reference(logits, k)
    return experts.contiguous(), weights.contiguous()  # the layout the fake promises, whichever path ran


# Experts [N, k] and weights [N, k]: the kernel on CUDA, the reference elsewhere, as one operator.
# torch.compile keeps it inside the compiled MoE layer's graph (an extern call); called as a Python
# function behind torch.compiler.disable it broke each of the 40 compiled MoE layers in two, and the
# first H200 warm-up with it took 3.7x as long.
route = torch.library.custom_op("retake::moe_routing", _route, mutates_args=(),
                                schema="(Tensor logits, int k) -> (Tensor, Tensor)")


@route.register_fake
def _(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = logits.shape[0]
    return (logits.new_empty((rows, k), dtype=torch.long), logits.new_empty((rows, k), dtype=torch.float32))

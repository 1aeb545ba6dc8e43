"""The MoE routing kernel equals moe.py's `top_experts` (CPU through Triton's interpreter,
the GPU at the full size): the same experts in the same order, the same weights."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import moe_routing

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def router_logits(rows: int, experts: int, generator: torch.Generator) -> torch.Tensor:
    """Distinct float32 logits (equal ones may rank either way in torch.topk), as a view of a
    wider packed projection like the fast path's router + shared-expert gate GEMM."""
    packed = torch.randn(rows, experts + 1, generator=generator, dtype=torch.float64) * 2
    return packed.float().to(DEVICE)[:, :experts]  # [rows, E], row stride E + 1


def check(rows: int, experts: int, k: int, seed: int) -> None:
    logits = router_logits(rows, experts, torch.Generator().manual_seed(seed))
    got_ids, got_weights = moe_routing.route_kernel(logits, k)
    ids, weights = moe_routing.route_reference(logits, k)
    assert got_ids.dtype == torch.long and got_weights.dtype == torch.float32
    assert torch.equal(got_ids, ids)
    torch.testing.assert_close(got_weights, weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_weights.sum(-1), torch.ones(rows, device=DEVICE))


@pytest.mark.kernel
def test_kernel_equals_reference() -> None:
    check(rows=5, experts=256, k=8, seed=0)  # the full router: 256 experts, top 8
    check(rows=3, experts=24, k=6, seed=1)  # widths that are not powers of two


@pytest.mark.kernel
def test_equal_logits_rank_by_lower_index_and_bfloat16_logits_are_read() -> None:
    logits = torch.zeros(2, 16, device=DEVICE)
    logits[0, 5] = logits[0, 9] = 1.0  # a tie at the top
    logits[1, 3] = -1.0
    ids, weights = moe_routing.route_kernel(logits.bfloat16(), 4)
    assert ids.tolist() == [[5, 9, 0, 1], [0, 1, 2, 4]]
    torch.testing.assert_close(weights, moe_routing.route_reference(logits, 4)[1])


def test_route_runs_the_reference_without_cuda() -> None:
    logits = router_logits(4, 32, torch.Generator().manual_seed(2)).cpu()
    ids, weights = moe_routing.route(logits, 8)
    expected_ids, expected_weights = moe_routing.route_reference(logits, 8)
    assert torch.equal(ids, expected_ids) and torch.equal(weights, expected_weights)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64, 300])
def test_kernel_equals_reference_at_full_size(rows: int) -> None:
    for seed in range(3):
        check(rows, 256, 8, seed)

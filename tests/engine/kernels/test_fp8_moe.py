"""The block-FP8 MoE kernel against its torch reference (GPU), and the reference's own
pieces on CPU: block layouts and block dequantisation."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.fp8 import dequantize_fp8, quantize_fp8
from engine.kernels import fp8_moe as m


def experts(E: int, D: int, I: int, device: str) -> tuple[torch.Tensor, ...]:
    w13, s13 = quantize_fp8(torch.randn(E, 2 * I, D, device=device) * 0.05)
    w2, s2 = quantize_fp8(torch.randn(E, D, I, device=device) * 0.05)
    return w13, s13, w2, s2


def routing(T: int, E: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = torch.randn(T, E, device=device).softmax(-1).topk(k)
    return ids, weights / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("T,k,E", [(1, 2, 4), (7, 3, 5), (33, 8, 16)])
def test_pairs_by_expert_covers_every_pair_once_in_its_experts_blocks(T: int, k: int, E: int) -> None:
    ids, _ = routing(T, E, k, "cpu")
    rows, blocks = m.pairs_by_expert(ids, E, block_m=4)
    assert rows.numel() == blocks.numel() * 4
    real = rows[rows < T * k]
    assert sorted(real.tolist()) == list(range(T * k))
    block_of_row = torch.arange(rows.numel()) // 4
    for slot in (rows < T * k).nonzero().flatten().tolist():
        assert blocks[block_of_row[slot]] == ids.reshape(-1)[rows[slot]]


def test_pairs_one_per_block_is_static() -> None:
    ids, _ = routing(3, 6, 2, "cpu")
    rows, blocks = m.pairs_one_per_block(ids, block_m=16)
    assert rows.view(6, 16)[:, 0].tolist() == list(range(6))
    assert (rows.view(6, 16)[:, 1:] == 6).all()
    assert blocks.tolist() == ids.reshape(-1).tolist()


def test_dequantize_blocks_scales_each_block() -> None:
    w = torch.randn(256, 384) * 0.1
    q, s = quantize_fp8(w[None])
    restored = dequantize_fp8(q[0], s[0])
    assert restored.shape == w.shape
    # float8 e4m3 keeps 3 mantissa bits: every element within 1/16 of its value (+ subnormals)
    assert ((restored - w).abs() <= w.abs() / 16 + s[0].max() * 2**-9).all()


def test_reference_without_activation_quantisation_matches_dense_loop() -> None:
    torch.manual_seed(0)
    E, D, I, T, k = 4, 256, 128, 5, 2
    w13, s13, w2, s2 = experts(E, D, I, "cpu")
    ids, weights = routing(T, E, k, "cpu")
    x = torch.randn(T, D)
    out = m.moe_reference(x, w13, s13, w2, s2, ids, weights, quantize_activations=False)
    for t in range(T):
        expected = torch.zeros(D)
        for j in range(k):
            e = ids[t, j]
            h = dequantize_fp8(w13[e], s13[e]) @ x[t]
            a = torch.nn.functional.silu(h[:I]) * h[I:]
            expected += weights[t, j] * (dequantize_fp8(w2[e], s2[e]) @ a)
        torch.testing.assert_close(out[t], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 4, 300])
def test_kernel_equals_reference(T: int) -> None:
    torch.manual_seed(T)
    E, D, I, k = 16, 512, 256, 4
    w13, s13, w2, s2 = experts(E, D, I, "cuda")
    ids, weights = routing(T, E, k, "cuda")
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    q, s = m.quantize_groups(x.float())
    q_ref, s_ref = m.quantize_groups_reference(x.float())
    torch.testing.assert_close(s, s_ref)
    assert (q.float() - q_ref.float()).abs().max() == 0
    ref = m.moe_reference(x.float(), w13, s13, w2, s2, ids, weights).float()
    for graph_safe in (True, False):
        out = m.fp8_moe(x.float(), w13, s13, w2, s2, ids, weights, graph_safe=graph_safe).float()
        error = (out - ref).norm() / ref.norm()
        assert error < 2e-2, (graph_safe, error)

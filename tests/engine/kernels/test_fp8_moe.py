"""The block-FP8 MoE kernel against its torch reference (GPU), and the reference's own
pieces on CPU: block layouts and block dequantisation. On CPU the kernels run in Triton's
interpreter, whose float8 casts are inexact: there the layouts and K splits are checked
against each other, and against the reference only on the GPU."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.fp8 import dequantize_fp8, quantize_fp8
from engine.kernels import fp8_moe as m
from engine.kernels.expert_layout import max_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def experts(E: int, D: int, inter: int, device: str) -> tuple[torch.Tensor, ...]:
    w13, s13 = quantize_fp8(torch.randn(E, 2 * inter, D, device=device) * 0.05)
    w2, s2 = quantize_fp8(torch.randn(E, D, inter, device=device) * 0.05)
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


def test_pairs_by_expert_has_static_shapes_and_marks_unused_blocks() -> None:
    ids = torch.tensor([[3, 1], [3, 0], [3, 2]])  # expert 3 thrice: two blocks of 2
    rows, blocks = m.pairs_by_expert(ids, num_experts=5, block_m=2)
    assert blocks.numel() == max_blocks(6, 5, 2) == 3 + 5
    assert blocks.tolist() == [0, 1, 2, 3, 3, -1, -1, -1]
    assert rows.view(-1, 2)[:5].tolist() == [[3, 6], [1, 6], [5, 6], [0, 2], [4, 6]]
    assert (rows.view(-1, 2)[5:] == 6).all()


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
    E, D, inter, T, k = 4, 256, 128, 5, 2
    w13, s13, w2, s2 = experts(E, D, inter, "cpu")
    ids, weights = routing(T, E, k, "cpu")
    x = torch.randn(T, D)
    out = m.moe_reference(x, w13, s13, w2, s2, ids, weights, quantize_activations=False)
    for t in range(T):
        expected = torch.zeros(D)
        for j in range(k):
            e = ids[t, j]
            h = dequantize_fp8(w13[e], s13[e]) @ x[t]
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            expected += weights[t, j] * (dequantize_fp8(w2[e], s2[e]) @ a)
        torch.testing.assert_close(out[t], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.kernel
def test_layouts_and_k_splits_agree() -> None:
    torch.manual_seed(1)
    E, D, inter, T, k = 4, 128, 128, 3, 2
    w13, s13, w2, s2 = experts(E, D, inter, DEVICE)
    ids, weights = routing(T, E, k, DEVICE)
    ids[1] = ids[0]  # two tokens share both experts: an "experts" block holds two pairs
    x = torch.randn(T, D, device=DEVICE)
    base = m.fp8_moe(x, w13, s13, w2, s2, ids, weights, layout="pairs", split_k=1)
    assert base.shape == (T, D) and base.dtype == x.dtype and base.abs().sum() > 0
    for layout, split in (("experts", 1), ("pairs", None), ("experts", None)):
        out = m.fp8_moe(x, w13, s13, w2, s2, ids, weights, layout=layout, split_k=split)
        torch.testing.assert_close(out, base, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 4, 300])
def test_kernel_equals_reference(T: int) -> None:
    torch.manual_seed(T)
    E, D, inter, k = 16, 512, 256, 4
    w13, s13, w2, s2 = experts(E, D, inter, "cuda")
    ids, weights = routing(T, E, k, "cuda")
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    q, s = m.quantize_groups(x.float())
    q_ref, s_ref = m.quantize_groups_reference(x.float())
    torch.testing.assert_close(s, s_ref)
    assert (q.float() - q_ref.float()).abs().max() == 0
    ref = m.moe_reference(x.float(), w13, s13, w2, s2, ids, weights).float()
    for layout in m.LAYOUTS:
        for split in (None, 1, 2):
            out = m.fp8_moe(x.float(), w13, s13, w2, s2, ids, weights, layout=layout, split_k=split).float()
            error = (out - ref).norm() / ref.norm()
            assert error < 2e-2, (layout, split, error)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 64])
def test_kernel_equals_reference_at_decode_shapes(T: int) -> None:
    """The full preset's experts (256 x 2048 x 512, top 8) in bfloat16, as a decode step calls them."""
    torch.manual_seed(T)
    E, D, inter, k = 256, 2048, 512, 8
    w13, s13, w2, s2 = experts(E, D, inter, "cuda")
    ids, weights = routing(T, E, k, "cuda")
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    ref = m.moe_reference(x, w13, s13, w2, s2, ids, weights).float()
    for layout in m.LAYOUTS:
        out = m.fp8_moe(x, w13, s13, w2, s2, ids, weights, layout=layout)
        assert out.dtype == torch.bfloat16
        error = (out.float() - ref).norm() / ref.norm()
        assert error < 2e-2, (layout, error)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["pairs", "experts"])
def test_kernel_replays_in_a_cuda_graph(layout: str) -> None:
    """No host sync in either layout: the call captures, and replays on new inputs."""
    torch.manual_seed(2)
    E, D, inter, T, k = 64, 512, 256, 8, 8
    w13, s13, w2, s2 = experts(E, D, inter, "cuda")
    ids, weights = routing(T, E, k, "cuda")
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        m.fp8_moe(x, w13, s13, w2, s2, ids, weights, layout=layout)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m.fp8_moe(x, w13, s13, w2, s2, ids, weights, layout=layout)
    new_ids, new_weights = routing(T, E, k, "cuda")
    ids.copy_(new_ids)
    weights.copy_(new_weights)
    x.normal_()
    graph.replay()
    torch.testing.assert_close(out, m.fp8_moe(x, w13, s13, w2, s2, ids, weights, layout=layout), rtol=0, atol=0)

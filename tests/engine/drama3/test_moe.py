"""The mixture of experts: block-FP8 dequantisation, FP8 vs dequantised experts, the two expert
paths, and the whole block against transformers' Qwen3.5-MoE sparse block."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.config import Drama3Config
from engine.drama3.fp8 import dequantize_fp8, quantize_fp8
from engine.drama3.moe import Experts, SparseMoE, experts_gathered, experts_grouped
from engine.drama3.tiny import tiny_config

TEXT = Drama3Config.from_dict(tiny_config()).text  # 128 wide, 8 experts, top 2, 128 intermediate


def test_dequantize_scales_each_128_block() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(256, 384, generator=generator).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3, generator=generator) + 0.5
    dense = dequantize_fp8(weight, scale, torch.float32)
    for i in range(2):
        for j in range(3):
            block = (slice(128 * i, 128 * (i + 1)), slice(128 * j, 128 * (j + 1)))
            torch.testing.assert_close(dense[block], weight[block].float() * scale[i, j], atol=0, rtol=0)


def test_quantize_round_trip_is_close() -> None:
    weight = torch.randn(256, 128, generator=torch.Generator().manual_seed(1)) / 11.0
    fp8, scale = quantize_fp8(weight)
    assert fp8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (2, 1)
    error = (dequantize_fp8(fp8, scale, torch.float32) - weight).abs().max() / weight.abs().max()
    assert error < 0.07  # e4m3 keeps 3 mantissa bits


def fp8_and_dense_experts(seed: int) -> tuple[Experts, Experts]:
    generator = torch.Generator().manual_seed(seed)
    fp8, dense = Experts(TEXT, fp8=True), Experts(TEXT, fp8=False)
    for name in ("w13", "w2"):
        stacked = [quantize_fp8(torch.randn(w.shape, generator=generator) / 11.0) for w in getattr(fp8, name)]
        getattr(fp8, name).copy_(torch.stack([q for q, _ in stacked]))
        getattr(fp8, name + "_scale_inv").copy_(torch.stack([s for _, s in stacked]))
        reference = torch.stack([dequantize_fp8(q, s, torch.float32) for q, s in stacked])
        getattr(dense, name).data.copy_(reference)
    return fp8, dense


def routing(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, TEXT.hidden_size, generator=generator)
    experts = torch.stack([torch.randperm(TEXT.num_experts, generator=generator)[:2] for _ in range(rows)])
    weights = torch.softmax(torch.randn(rows, 2, generator=generator), -1)
    return x, experts, weights


@pytest.mark.parametrize("rows", [1, 3, 100])  # gathered below 64 (row, expert) pairs, grouped above
def test_fp8_experts_equal_the_dequantised_reference(rows: int) -> None:
    fp8, dense = fp8_and_dense_experts(seed=rows)
    x, experts, weights = routing(rows, seed=rows)
    with torch.inference_mode():
        torch.testing.assert_close(fp8(x, experts, weights), dense(x, experts, weights), atol=1e-5, rtol=1e-5)


def test_gathered_and_grouped_paths_agree() -> None:
    fp8, _ = fp8_and_dense_experts(seed=5)
    x, experts, weights = routing(20, seed=5)
    with torch.inference_mode():
        gathered = experts_gathered(fp8, x, experts, weights)
        grouped = experts_grouped(fp8, x, experts, weights)
        one_by_one = torch.cat([experts_grouped(fp8, x[i:i + 1], experts[i:i + 1], weights[i:i + 1])
                                for i in range(20)])
    assert gathered.abs().mean() > 0.01
    torch.testing.assert_close(gathered, grouped, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped, one_by_one, atol=1e-5, rtol=1e-5)


def test_block_matches_transformers_sparse_moe() -> None:
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    torch.manual_seed(3)
    ours = SparseMoE(TEXT, fp8=False)
    for parameter in ours.parameters():
        parameter.data.normal_(0.0, TEXT.hidden_size ** -0.5)
    theirs = Qwen3_5MoeSparseMoeBlock(Qwen3_5MoeTextConfig(
        hidden_size=TEXT.hidden_size, num_experts=TEXT.num_experts, num_experts_per_tok=TEXT.num_experts_per_tok,
        moe_intermediate_size=TEXT.moe_intermediate_size,
        shared_expert_intermediate_size=TEXT.shared_expert_intermediate_size))
    theirs.load_state_dict({
        "gate.weight": ours.gate.weight, "experts.gate_up_proj": ours.experts.w13, "experts.down_proj": ours.experts.w2,
        **{f"shared_expert.{k}": v for k, v in ours.shared_expert.state_dict().items()},
        "shared_expert_gate.weight": ours.shared_expert_gate.weight,
    })
    x = torch.randn(2, 50, TEXT.hidden_size)
    with torch.inference_mode():
        experts, weights = ours.route(x.flatten(0, 1))
        torch.testing.assert_close(weights.sum(-1), torch.ones(100))
        assert len(experts.unique()) > 4  # routing spreads over the experts
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(x[:, :1]), theirs(x[:, :1]), atol=1e-5, rtol=1e-5)  # the gathered path

"""The FP8 experts' layout kernel (engine/kernels/expert_layout.py) gives fp8_moe.pairs_by_expert's
rows and experts exactly: pairs grouped by expert in their order, padded blocks, -1 past the
used blocks; with many pairs on one expert, experts with none, and a non-power-of-two count."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import fp8_moe

pytestmark = pytest.mark.kernel
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


@pytest.mark.parametrize("tokens,k,experts,block_m", [(1, 2, 4, 16), (7, 3, 5, 2), (40, 8, 256, 16),
                                                      (300, 8, 256, 64), (9, 4, 12, 4)])
def test_layout_is_pairs_by_expert(tokens: int, k: int, experts: int, block_m: int) -> None:
    from engine.kernels.expert_layout import expert_layout

    generator = torch.Generator().manual_seed(tokens)
    ids = torch.rand(tokens, experts, generator=generator).topk(k).indices  # distinct experts per token
    ids[: tokens // 2, 0] = experts - 1  # one expert chosen by half the tokens: several blocks
    want_rows, want_experts = fp8_moe.pairs_by_expert(ids, experts, block_m)
    rows, blocks = expert_layout(ids.to(DEVICE), experts, block_m)
    assert rows.dtype == blocks.dtype == torch.int32
    assert torch.equal(rows.cpu(), want_rows) and torch.equal(blocks.cpu(), want_experts)

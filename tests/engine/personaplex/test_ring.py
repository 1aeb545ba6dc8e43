"""The float8 ring's dequantisation: a few rows at a time (bounded memory) is the same arithmetic."""

from __future__ import annotations

import pytest
import torch

from engine.personaplex import ring


def test_dequantising_many_rows_a_few_at_a_time_is_the_same_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(5, 2, 7, 4, generator=torch.Generator().manual_seed(0))  # [B, H, C, Dh]
    quantized, scales = ring.quantize_kv(x)
    whole = ring.dequantize_kv(quantized, scales, torch.bfloat16)
    torch.testing.assert_close(whole.float(), x, rtol=0.07, atol=0.02)  # float8's 3 bits of mantissa
    monkeypatch.setattr(ring, "DEQUANTIZE_VALUES", 2 * quantized[0].numel())  # two rows a time: 2 + 2 + 1
    assert torch.equal(ring.dequantize_kv(quantized, scales, torch.bfloat16), whole)
    assert torch.equal(ring.dequantize_kv(quantized[:0], scales[:0], torch.bfloat16), whole[:0])

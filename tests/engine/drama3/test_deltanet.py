"""Gated DeltaNet: the chunked form equals the recurrent one, and both equal transformers' reference."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.deltanet import chunked_delta_rule, gated_delta_rule, l2_normalize, recurrent_delta_rule


def inputs(rows: int, seed: int, heads: int = 3, dk: int = 16, dv: int = 8):
    generator = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(2, rows, heads, dk, generator=generator)) * dk ** -0.5
    k = l2_normalize(torch.randn(2, rows, heads, dk, generator=generator))
    v = torch.randn(2, rows, heads, dv, generator=generator)
    g = -torch.rand(2, rows, heads, generator=generator) * 2.0  # decays exp(g) in [0.14, 1]
    beta = torch.rand(2, rows, heads, generator=generator)
    state = torch.randn(2, heads, dk, dv, generator=generator)
    return q, k, v, g, beta, state


@pytest.mark.parametrize(("rows", "chunk"), [(1, 64), (5, 64), (64, 64), (150, 64), (37, 8)])
def test_chunked_equals_recurrent(rows: int, chunk: int) -> None:
    q, k, v, g, beta, state = inputs(rows, seed=rows)
    out, final = recurrent_delta_rule(q, k, v, g, beta, state)
    chunked_out, chunked_final = chunked_delta_rule(q, k, v, g, beta, state, chunk=chunk)
    assert out.shape == (2, rows, 3, 8) and final.shape == (2, 3, 16, 8)
    torch.testing.assert_close(chunked_out, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked_final, final, atol=1e-5, rtol=1e-5)


def test_state_carries_across_calls() -> None:
    """Two calls of 30 and 45 rows, the second from the first's state, equal one call of 75."""
    q, k, v, g, beta, state = inputs(75, seed=7)
    whole, whole_state = gated_delta_rule(q, k, v, g, beta, state)
    first, mid = gated_delta_rule(q[:, :30], k[:, :30], v[:, :30], g[:, :30], beta[:, :30], state)
    second, end = gated_delta_rule(q[:, 30:], k[:, 30:], v[:, 30:], g[:, 30:], beta[:, 30:], mid)
    torch.testing.assert_close(torch.cat((first, second), 1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, whole_state, atol=1e-5, rtol=1e-5)


def test_matches_transformers_reference() -> None:
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
        torch_chunk_gated_delta_rule,
        torch_recurrent_gated_delta_rule,
    )

    q, k, v, g, beta, state = inputs(100, seed=11)
    # transformers normalises q and k itself and scales q by 1/sqrt(dk): give it the raw directions.
    raw_q, raw_k = q * 16 ** 0.5, k
    ours, ours_state = chunked_delta_rule(q, k, v, g, beta, state)
    for reference in (torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule):
        theirs, their_state = reference(raw_q, raw_k, v, g, beta, initial_state=state, output_final_state=True,
                                        use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours_state, their_state, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_the_fast_paths_decode_step_is_the_layers_forward(tiny_model) -> None:
    """fast.py's one-row path (the decode-step kernel's call; its torch reference on a CPU)
    gives the layer's own output and leaves its states the same, over a few steps of slots
    at different positions (one starting its take)."""
    from engine.drama3.deltanet import GatedDeltaNet
    from engine.drama3.fast import deltanet_decode

    model, _, _ = tiny_model
    model.setup_caches(3, 32, "cpu", torch.float32)
    layer = next(m for m in model.modules() if isinstance(m, GatedDeltaNet))
    fast = deltanet_decode(layer)
    generator = torch.Generator().manual_seed(0)
    layer.conv_state.normal_(generator=generator)
    layer.recurrent_state.normal_(generator=generator)
    slots, positions = torch.tensor([2, 0]), torch.tensor([[5], [0]])
    states = layer.conv_state.clone(), layer.recurrent_state.clone()
    for step in range(3):
        x = torch.randn(2, 1, layer.in_proj_qkv.in_features, generator=generator)
        layer.conv_state.copy_(states[0])
        layer.recurrent_state.copy_(states[1])
        expected = layer(x, positions + step, slots)
        after = layer.conv_state.clone(), layer.recurrent_state.clone()
        layer.conv_state.copy_(states[0])
        layer.recurrent_state.copy_(states[1])
        got = fast(x, positions + step, slots)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.conv_state, after[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.recurrent_state, after[1], rtol=1e-5, atol=1e-5)
        states = after

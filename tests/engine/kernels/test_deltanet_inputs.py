"""The delta rule's inputs of a prefill chunk (engine/kernels/deltanet_inputs.py): the kernel
makes what GatedDeltaNet.rule_inputs makes, rounded as the bfloat16 chunked rule reads it, with
padded rows masked; a layer with the kernel installed (fast.py `deltanet_inputs`) prefills
padded chunks of two slots as the plain layer does under a rule that reads bfloat16 inputs."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.drama3.config import TextConfig
from engine.drama3.deltanet import chunked_delta_rule
from engine.drama3.tiny import tiny_config

from .test_deltanet_step import DEVICE, layer_of

pytestmark = pytest.mark.kernel


def bfloat16_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch rule reading its inputs as fast.py's flash-linear-attention rule does: q, k, v and
    beta rounded to bfloat16, g and the state float32."""
    def rounded(x: torch.Tensor) -> torch.Tensor:
        return x.bfloat16().float()

    return chunked_delta_rule(rounded(q), rounded(k), rounded(v), g.float(), rounded(beta), state.float())


@pytest.mark.parametrize("padded", [False, True])
def test_kernel_is_the_layers_rule_inputs(padded: bool) -> None:
    from engine.kernels.deltanet_inputs import deltanet_inputs_kernel

    config = TextConfig.from_dict(tiny_config()["text_config"])
    layer = layer_of(config, torch.bfloat16, DEVICE, slots=2, seed=1)
    generator = torch.Generator().manual_seed(2)
    B, T = 2, 6
    mixed = torch.randn(B, layer.conv_channels, T, generator=generator).bfloat16().to(DEVICE).transpose(1, 2)
    packed = torch.randn(B, T, 2 * layer.v_heads + 5, generator=generator).bfloat16().to(DEVICE)
    b, a = packed[..., :layer.v_heads], packed[..., layer.v_heads:2 * layer.v_heads]  # views, as projected
    valid = torch.tensor([6, 3], device=DEVICE) if padded else None
    expected = layer.rule_inputs(mixed, b, a, valid)
    got = deltanet_inputs_kernel(mixed, b, a, valid, layer.A_log, layer.dt_bias, layer.k_heads, layer.k_dim)
    for name, want, have in zip(("q", "k", "v"), expected[:3], got[:3]):
        assert have.dtype == torch.bfloat16 and have.shape == want.shape, name
        torch.testing.assert_close(have.float(), want.bfloat16().float(), rtol=2**-7, atol=1e-6, msg=name)
    for name, want, have in zip(("g", "beta"), expected[3:], got[3:]):
        assert have.dtype == torch.float32 and have.shape == want.shape, name
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6, msg=name)
    if padded:
        assert not got[3][1, 3:].any() and not got[4][1, 3:].any()  # padding: no decay, no write


def test_a_layer_with_the_kernel_prefills_as_the_plain_layer() -> None:
    from engine.drama3.fast import deltanet_inputs

    config = TextConfig.from_dict(tiny_config()["text_config"])
    plain = layer_of(config, torch.bfloat16, DEVICE, slots=3, seed=3)
    plain.rule = bfloat16_rule
    fused = copy.deepcopy(plain)
    vars(fused)["rule_inputs"] = deltanet_inputs(fused)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, 8, config.hidden_size, generator=generator).bfloat16().to(DEVICE)
    positions = torch.tensor([[0], [37]], device=DEVICE) + torch.arange(8, device=DEVICE)  # a take starting; one on
    slots, valid = torch.tensor([2, 0], device=DEVICE), torch.tensor([8, 5], device=DEVICE)
    with torch.no_grad():
        want = plain(x, positions, slots, valid)
        got = fused(x, positions, slots, valid)
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[1, :5], want[1, :5], rtol=2e-2, atol=2e-2)  # the padded rows' outputs are not kept
    torch.testing.assert_close(fused.recurrent_state, plain.recurrent_state, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(fused.conv_state, plain.conv_state, rtol=0, atol=0)



@pytest.mark.gpu
def test_kernel_at_the_full_size() -> None:
    """A 512-row chunk of the full preset's DeltaNet (16 key heads serving 32 value heads of 128)."""
    from engine.drama3.config import preset
    from engine.kernels.deltanet_inputs import deltanet_inputs_kernel

    config = TextConfig.from_dict(preset("full")["text_config"])
    layer = layer_of(config, torch.bfloat16, "cuda", slots=1, seed=5)
    generator = torch.Generator().manual_seed(6)
    mixed = torch.randn(1, 512, layer.conv_channels, generator=generator).bfloat16().cuda()
    b, a = torch.randn(2, 1, 512, layer.v_heads, generator=generator).bfloat16().cuda()
    valid = torch.tensor([300], device="cuda")
    expected = layer.rule_inputs(mixed, b, a, valid)
    got = deltanet_inputs_kernel(mixed, b, a, valid, layer.A_log, layer.dt_bias, layer.k_heads, layer.k_dim)
    for want, have in zip(expected[:3], got[:3]):
        torch.testing.assert_close(have.float(), want.bfloat16().float(), rtol=2**-7, atol=1e-6)
    for want, have in zip(expected[3:], got[3:]):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6)

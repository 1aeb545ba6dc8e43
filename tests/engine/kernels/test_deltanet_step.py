"""The Gated DeltaNet decode step: its reference is GatedDeltaNet.forward for one row per
slot, and the kernel equals the reference (outputs and both states) over several steps,
with a take starting at position 0 among continuing ones and slots out of order."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.drama3.config import TextConfig, preset
from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.tiny import tiny_config
from engine.kernels import deltanet_step as ds

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def layer_of(config: TextConfig, dtype: torch.dtype, device: str, slots: int, seed: int) -> GatedDeltaNet:
    torch.manual_seed(seed)
    layer = GatedDeltaNet(config)
    with torch.no_grad():
        layer.A_log.uniform_(-1.0, 1.0)
        layer.dt_bias.uniform_(-1.0, 1.0)
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.conv1d.weight.normal_(0.0, 0.5)
    layer = layer.to(device=device, dtype=dtype)
    layer.A_log.data = layer.A_log.data.float()  # the model keeps its decay parameters float32
    layer.dt_bias.data = layer.dt_bias.data.float()
    layer.setup_cache(slots, device, dtype)
    layer.conv_state.normal_()
    layer.recurrent_state.normal_(0.0, 0.3)
    return layer


def projections(layer: GatedDeltaNet, rows: int, dtype: torch.dtype, device: str,
                generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """mixed, z, b, a as views of one packed projection output, as the fused path makes them."""
    widths = (layer.conv_channels, layer.v_heads * layer.v_dim, layer.v_heads, layer.v_heads)
    packed = torch.randn(rows, sum(widths), generator=generator).to(device=device, dtype=dtype)
    return tuple(packed.split(widths, dim=-1))


def test_reference_is_the_layers_forward_for_one_row_per_slot() -> None:
    config = TextConfig.from_dict(tiny_config()["text_config"])
    layer = layer_of(config, torch.float32, "cpu", slots=3, seed=0)
    twin = copy.deepcopy(layer)
    x = torch.randn(3, config.hidden_size)
    positions, slots = torch.tensor([5, 0, 9]), torch.tensor([2, 0, 1])
    with torch.no_grad():
        expected = layer(x[:, None], positions[:, None], slots)[:, 0]
        mixed, z, b, a = (t[:, 0] for t in twin.project(x[:, None]))
        got = twin.out_proj(ds.deltanet_step_reference(ds.step_layer(twin), mixed, z, b, a, positions, slots))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(twin.conv_state, layer.conv_state, rtol=0, atol=0)
    torch.testing.assert_close(twin.recurrent_state, layer.recurrent_state, rtol=1e-6, atol=1e-6)


def check(config: TextConfig, rows: int, dtype: torch.dtype, device: str, seed: int) -> None:
    slots_total = rows + 2
    reference = layer_of(config, dtype, device, slots_total, seed)
    kernel = copy.deepcopy(reference)
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randperm(slots_total, generator=generator)[:rows].to(device)
    positions = torch.randint(1, 500, (rows,), generator=generator).to(device)
    positions[0] = 0  # a take starting: its states start from zero
    out_tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for _ in range(3):
        mixed, z, b, a = projections(reference, rows, dtype, device, generator)
        with torch.no_grad():
            expected = ds.deltanet_step_reference(ds.step_layer(reference), mixed, z, b, a, positions, slots)
            got = ds.deltanet_step_kernel(ds.step_layer(kernel), mixed, z, b, a, positions, slots)
        assert got.dtype == dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, **out_tolerance)
        torch.testing.assert_close(kernel.conv_state, reference.conv_state, rtol=0, atol=0)
        torch.testing.assert_close(kernel.recurrent_state, reference.recurrent_state, rtol=1e-4, atol=1e-4)
        positions = positions + 1


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference(dtype: torch.dtype) -> None:
    config = TextConfig.from_dict(tiny_config()["text_config"])  # 2 key heads, 4 value heads, 32 x 32
    check(config, rows=3, dtype=dtype, device=DEVICE, seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_kernel_equals_reference_at_full_size(rows: int) -> None:
    config = TextConfig.from_dict(preset("full")["text_config"])  # 16 key heads, 32 value heads, 128 x 128
    check(config, rows=rows, dtype=torch.bfloat16, device="cuda", seed=rows)

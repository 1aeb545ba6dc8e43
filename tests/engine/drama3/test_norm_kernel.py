"""The residual add + RMSNorm of the decode step (`RMSNorm.add`) and fast.py's kernel call
in its place (`norm_kernel`, installed by `install_fast_path(kernels=("add_rms_norm",))`):
on a CPU the call runs the kernel's torch reference, so these check the plumbing and the
reference against the layer; tests/engine/kernels/test_norm.py holds the Triton kernel to
the reference, and test_fast_gpu.py the step with the kernel to the step without it."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.backbone import DecoderLayer
from engine.drama3.fast import install_fast_path, norm_kernel
from engine.drama3.layers import RMSNorm
from engine.drama3.tower import TowerBlock


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_is_the_residual_add_then_the_norm(dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data.normal_(generator=generator)
    x, update = (torch.randn(3, 1, 64, generator=generator).to(dtype) for _ in range(2))
    normed, summed = norm.add(x, update)
    assert torch.equal(summed, x + update)
    assert torch.equal(normed, norm(x + update))


@torch.inference_mode()
def test_the_kernel_call_gives_the_layers_add_in_every_layer_it_applies_to(tiny_model) -> None:
    model, _, _ = tiny_model
    norms = [m.post_attention_layernorm if isinstance(m, DecoderLayer) else m.ffn_norm
             for m in model.modules() if isinstance(m, (DecoderLayer, TowerBlock))]
    assert len(norms) == len(model.backbone.layers) + len(model.tower.shared_layers) + len(model.tower.residual_layers)
    generator = torch.Generator().manual_seed(1)
    for norm in norms:
        width = norm.weight.shape[0]
        x, update = torch.randn(4, 1, width, generator=generator), torch.randn(4, 1, width, generator=generator)
        expected = norm.add(x, update)
        got = norm_kernel(norm)(x, update)
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)  # the sum rounds the same way
        torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=1e-6)  # the mean in another order


def test_unknown_kernels_are_refused_with_the_choices(tiny_model) -> None:
    model, _, _ = tiny_model
    with pytest.raises(ValueError, match="add_rms_norm"):
        install_fast_path(model, kernels=("fused_everything",))

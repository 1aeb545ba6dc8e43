"""Fused RMSNorm + residual add + cast: the kernel equals its reference, and the reference
equals the model's own layers (layers.RMSNorm after `x + h`, deltanet's plain-weight form)."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.layers import RMSNorm
from engine.kernels import casts, norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator) * 3).to(dtype).to(device)
    update = torch.randn(shape, generator=generator).to(dtype).to(device)
    weight = (torch.randn(shape[-1], generator=generator) * 0.2).to(dtype).to(device)
    return x, update, weight


def test_reference_is_the_model_layer() -> None:
    x, update, weight = inputs((3, 5, 64), torch.bfloat16, "cpu", 0)
    layer = RMSNorm(64, 1e-6).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
    normed, summed = norm.add_rms_norm_reference(x, update, weight, 1e-6)
    assert torch.equal(summed, x + update)
    assert torch.equal(normed, layer(x + update))


def check(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> None:
    x, update, weight = inputs(shape, dtype, device, seed)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 2**-7}
    for zero_centred in (True, False):
        normed, summed = norm.add_rms_norm_kernel(x, update, weight, 1e-6, zero_centred=zero_centred)
        ref_normed, ref_summed = norm.add_rms_norm_reference(x, update, weight, 1e-6, zero_centred=zero_centred)
        assert torch.equal(summed, ref_summed) and normed.dtype == dtype and normed.shape == x.shape
        torch.testing.assert_close(normed, ref_normed, **tolerance)
        plain = norm.rms_norm_kernel(x, weight, 1e-6, zero_centred=zero_centred, out_dtype=torch.float32)
        torch.testing.assert_close(plain, norm.rms_norm_reference(x, weight, 1e-6, zero_centred=zero_centred,
                                                                  out_dtype=torch.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference(dtype: torch.dtype) -> None:
    check((3, 96), dtype, DEVICE, 1)  # a width that is not a power of two
    check((2, 2, 64), dtype, DEVICE, 2)


@pytest.mark.kernel
def test_kernel_reads_strided_rows() -> None:
    x, _, weight = inputs((4, 128), torch.float32, DEVICE, 3)
    q_heads = x[:, :64]  # every other half-row: a view with row stride 128
    torch.testing.assert_close(norm.rms_norm_kernel(q_heads, weight[:64], 1e-6),
                               norm.rms_norm_reference(q_heads, weight[:64], 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_kernel_equals_reference_at_model_widths(rows: int) -> None:
    check((rows, 2048), torch.bfloat16, "cuda", rows)  # backbone and tower rows
    check((rows, 16, 256), torch.bfloat16, "cuda", rows)  # per-head q/k norms


@pytest.mark.kernel
def test_round_to_bfloat16_is_torchs_rounding() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def round_kernel(x_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out_ptr + i, casts.round_to(tl.load(x_ptr + i), out_ptr.dtype.element_ty))

    ties = (torch.arange(1, 65, dtype=torch.int32) * 0x10000 + 0x3F808000).view(torch.float32)  # exact halves
    special = torch.tensor([0.0, -0.0, 1.5e-38, -3.4e38, 3.4028235e38, float("inf"), -float("inf")])
    x = torch.cat((ties, special, torch.randn(57) * 100)).to(DEVICE)  # [128]
    out = torch.empty(128, dtype=torch.bfloat16, device=DEVICE)
    round_kernel[(1,)](x, out, N=128)
    assert torch.equal(out.view(torch.int16), x.bfloat16().view(torch.int16))

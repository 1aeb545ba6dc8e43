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


TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2**-7, "atol": 2**-7}}


def check(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> None:
    x, update, weight = inputs(shape, dtype, device, seed)
    tolerance = TOLERANCE[dtype]
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
    from engine.drama3.deltanet import gated_rms_norm

    x, z, weight = inputs((rows, 32, 128), torch.bfloat16, "cuda", rows)  # DeltaNet's gated norm per value head
    got = norm.gated_rms_norm_kernel(x.float(), z, weight, 1e-6)
    torch.testing.assert_close(got, gated_rms_norm(x.float(), z, weight, 1e-6), **TOLERANCE[torch.bfloat16])
    from engine.drama3.layers import rope_table

    x, _, weight = inputs((1, rows, 16, 256), torch.bfloat16, "cuda", rows)  # backbone q heads, a quarter rotated
    rope = rope_table(rows, 64, 1e7, "cuda")[None]  # [1, T, 2, 32]
    got = norm.rotated_rms_norm_kernel(x, weight, 1e-6, rope, False)
    torch.testing.assert_close(got, norm.rotated_rms_norm_reference(x, weight, 1e-6, rope, False),
                               **TOLERANCE[torch.bfloat16])


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


@pytest.mark.kernel
def test_prefill_norms_keep_the_chunk_and_leave_decode_steps_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `prefill_norms` (fast.py) a prefill chunk's norms (DeltaNet's gated ones, the q/k
    norms with their rope) run the kernel, one launch each,
    and the chunk's last hidden state and caches are the plain model's; a decode step's norms
    keep the module's code (the compiled layers fuse them)."""
    from engine.drama3.config import Drama3Config
    from engine.drama3.decoder import Decoder
    from engine.drama3.deltanet import GatedRMSNorm
    from engine.drama3.fast import NormRows, gated_norm_rows
    from engine.drama3.random_weights import random_model
    from engine.drama3.tiny import tiny_config

    launches = []
    for name in ("rms_norm_kernel", "add_rms_norm_kernel", "gated_rms_norm_kernel", "rotated_rms_norm_kernel"):
        kernel = getattr(norm, name)
        monkeypatch.setattr(norm, name, lambda *args, kernel=kernel, name=name: launches.append(name) or kernel(*args))
    config = Drama3Config.from_dict(tiny_config())
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = random_model(config, DEVICE, torch.float32).eval()
        norms = [m for m in model.modules() if isinstance(m, (RMSNorm, GatedRMSNorm))]
        if fused:
            for module in norms:
                if isinstance(module, RMSNorm):
                    NormRows(module).install()
                else:
                    vars(module)["forward"] = gated_norm_rows(module)
        model.setup_caches(1, 256, DEVICE, torch.float32)
        rows = torch.randint(0, 200, (16, config.frame_width), generator=torch.Generator().manual_seed(1))
        rows[:, 0] = torch.randint(0, config.text.vocab_size, (16,), generator=torch.Generator().manual_seed(2))
        with torch.inference_mode():
            decoder = Decoder(model, 256)
            prefill = decoder.chunked.begin(rows.to(DEVICE), 0)
            hidden = decoder.chunked.run(prefill)
            assert hidden is not None
            chunk_launches = len(launches)
            decoder.position.fill_(16)
            decoder.advance_index(64, decoder.index[:1])  # one decode step
            cache = model.tower.residual_layers[-1].transformer_layer.attention.kv_cache
            results.append((hidden.clone(), cache.k.clone()))
        if fused:
            assert chunk_launches == len(norms)  # each norm once in the chunk
            assert len(launches) == chunk_launches, "a decode step's norm went through the kernel"
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    # the tower's last cache went through 17 layers of float32 roundings of the mean
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-4)


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_kernel_equals_the_deltanet_norm(dtype: torch.dtype) -> None:
    from engine.drama3.deltanet import GatedRMSNorm

    x, z, weight = inputs((2, 7, 4, 64), dtype, "cpu", 3)
    layer = GatedRMSNorm(64, 1e-6)
    with torch.no_grad():
        layer.weight.copy_(weight.float() + 1)
    x = x.float()  # the delta rule's output is float32; the gate is in the model dtype
    expected = layer(x, z)
    got = norm.gated_rms_norm_kernel(x.to(DEVICE), z.to(DEVICE), layer.weight.to(DEVICE), 1e-6)
    assert got.dtype == z.dtype
    torch.testing.assert_close(got.cpu(), expected, **TOLERANCE[dtype])


@pytest.mark.kernel
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotated_kernel_is_the_norm_then_the_rope(interleaved: bool, dtype: torch.dtype) -> None:
    """q as the attention layers cut it from their projection (heads strided, gates between
    them), rotary dims a part of the head (partial rope), two rows of positions."""
    from engine.drama3.layers import rope_table

    B, T, H, DH, rotary = 2, 5, 3, 64, 32
    generator = torch.Generator().manual_seed(4)
    packed = (torch.randn(B, T, H, 2 * DH, generator=generator) * 2).to(dtype)
    q = packed[..., :DH]  # [B, T, H, Dh], each head's gate beside it
    weight = (torch.randn(DH, generator=generator) * 0.2).to(dtype)
    positions = torch.randint(0, 100, (B, T), generator=generator)
    rope = rope_table(128, rotary, 10_000.0, "cpu")[positions]  # [B, T, 2, rot/2]
    layer = RMSNorm(DH, 1e-6).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    expected = layer.rotated(q, rope, interleaved)
    torch.testing.assert_close(norm.rotated_rms_norm_reference(q, weight, 1e-6, rope, interleaved), expected,
                               rtol=0, atol=0)
    got = norm.rotated_rms_norm_kernel(q.to(DEVICE), weight.to(DEVICE), 1e-6, rope.to(DEVICE), interleaved)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.cpu(), expected, **TOLERANCE[dtype])

"""Counter-based draws: the torch Philox is the published Philox 4x32-10, the kernels' noise
equals the reference's, and the noise is Gumbel(0, 1) and changes with every counter word."""

from __future__ import annotations

import math

import pytest
import torch

from engine.kernels import draws

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def words(*values: int) -> list[torch.Tensor]:
    return [torch.tensor([[v]]) for v in values]


@pytest.mark.parametrize("philox", [draws.philox_torch, draws.philox_numpy])
def test_philox_reference_matches_the_published_test_vectors(philox) -> None:
    # Random123's known answers for Philox 4x32-10 (first output word); key = (seed low, seed high).
    seed, *counter = words(0, 0, 0, 0, 0)
    assert int(philox(seed, *counter)) == 0x6627E8D5
    seed, *counter = words((0x299F31D0 << 32) | 0xA4093822, 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert int(philox(seed, *counter)) == 0xD16CFE09


def test_the_numpy_philox_gives_the_torch_words() -> None:
    """On a CPU the reference draws through numpy (fewer, cheaper ops): the same words, seeds
    and counters past 32 bits included, broadcast as the draws broadcast them."""
    generator = torch.Generator().manual_seed(0)
    seed = torch.randint(0, 2**62, (3, 1), generator=generator)
    counter = torch.randint(0, 2**40, (3, 1), generator=generator)
    index = torch.arange(4097)[None].expand(3, -1)
    stream = torch.full_like(index, draws.STREAM_CODE + 8)
    words_numpy = draws.philox_numpy(seed, index, counter & draws.MASK32, stream, counter >> 32)
    words_torch = draws.philox_torch(seed, index, counter & draws.MASK32, stream, counter >> 32)
    assert words_numpy.shape == (3, 4097) and torch.equal(words_numpy, words_torch)


def test_noise_is_gumbel_and_every_counter_word_matters() -> None:
    index = torch.arange(200_000)[None]
    noise = draws.gumbel_reference(torch.tensor([12345]), torch.tensor([7]), draws.STREAM_MAIN, index)[0]
    assert noise.dtype == torch.float64 and torch.isfinite(noise).all()
    assert abs(noise.mean().item() - 0.5772156649) < 0.01  # Euler's constant
    assert abs(noise.var().item() - math.pi**2 / 6) < 0.03
    base = draws.gumbel_reference(torch.tensor([1, 1]), torch.tensor([5, 5]), 3, torch.arange(64).expand(2, -1))
    assert torch.equal(base[0], base[1])  # a pure function of its inputs
    for seed, counter, stream in ((2, 5, 3), (1, 6, 3), (1, 5, 4), (1, 5 + 2**32, 3)):
        other = draws.gumbel_reference(torch.tensor([seed]), torch.tensor([counter]), stream, torch.arange(64)[None])
        assert not torch.isclose(other[0], base[0]).any()


def check_kernel_noise(dev: str, n: int) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def noise_kernel(seed_ptr, counter_ptr, out_ptr, stream, N: tl.constexpr):
        row = tl.program_id(0)
        index = tl.arange(0, N)
        noise = draws.gumbel(tl.load(seed_ptr + row), tl.load(counter_ptr + row), stream, index)
        tl.store(out_ptr + row * N + index, noise)

    seed = torch.tensor([0, 3, 2**62 + 12345], device=dev)
    counter = torch.tensor([0, 1199, 2**32 + 7], device=dev)
    out = torch.empty(3, n, dtype=torch.float64, device=dev)
    noise_kernel[(3,)](seed, counter, out, 5, N=n)
    expected = draws.gumbel_reference(seed, counter, 5, torch.arange(n, device=dev).expand(3, -1))
    torch.testing.assert_close(out, expected, rtol=1e-13, atol=0)


@pytest.mark.kernel
def test_kernel_noise_equals_reference() -> None:
    check_kernel_noise(DEVICE, 256)


@pytest.mark.gpu
def test_kernel_noise_equals_reference_on_the_gpu() -> None:
    check_kernel_noise("cuda", 8192)

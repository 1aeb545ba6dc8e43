"""The codec decoder's Snake in one pass: the kernel equals its reference, and the reference is
the codec layer's own arithmetic."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.codec_layers import Snake
from engine.kernels import snake

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def inputs(shape: tuple[int, int, int], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator) * 2).to(dtype)
    alpha = torch.rand(1, shape[1], 1, generator=generator) * 3 + 0.05  # trained alphas are positive
    return x, alpha


def test_reference_is_the_codec_layer() -> None:
    x, alpha = inputs((2, 6, 50), torch.float32, 0)
    layer = Snake(6)
    with torch.no_grad():
        layer.alpha.copy_(alpha)
        assert torch.equal(snake.snake_reference(x, alpha), layer(x))


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 3, 1), (2, 5, 1030), (1, 4, 2048)])
def test_the_kernel_equals_the_reference(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    x, alpha = inputs(shape, dtype, 1)
    x, alpha = x.to(DEVICE), alpha.to(DEVICE)
    out = snake.snake_kernel(x, alpha, snake.snake_inverse(alpha))
    expected = snake.snake_reference(x, alpha)
    assert out.dtype == dtype and out.shape == x.shape
    # float32: sin and the order of the sums agree to float32 rounding; float16: one rounding of the same value
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2**-10, "atol": 2**-14}
    torch.testing.assert_close(out, expected, **tolerance)
    assert not torch.equal(out, x)  # it did something

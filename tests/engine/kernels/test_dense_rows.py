"""The few-row dense kernel (engine/kernels/dense_rows.py) against F.linear: on CPU through
Triton's interpreter at odd small sizes, on the GPU at the full model's shapes; past 16 rows
it is F.linear itself; the operator stays inside a compiled graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import dense_rows as dr

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)


def inputs(rows: int, n: int, k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, k] as a view of a wider tensor (row stride k + 24, as a packed projection's slice)
    and a weight [n, k] of a linear layer's scale."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, k + 24, generator=g)
    weight = torch.randn(n, k, generator=g) * k**-0.5
    return wide.to(DEVICE, dtype)[:, 8:8 + k], weight.to(DEVICE, dtype)


def check(rows: int, n: int, k: int, dtype: torch.dtype, seed: int = 0) -> None:
    x, weight = inputs(rows, n, k, dtype, seed)
    out = dr.dense_rows_kernel(x, weight)
    exact = F.linear(x.double(), weight.double())  # the same inputs' product, unrounded
    assert out.shape == (rows, n) and out.dtype == dtype and out.is_contiguous()
    # bfloat16: within about one ulp of the exact product (the interpreter truncates to bfloat16
    # where the GPU rounds); float32: the summation order's few ulps
    tolerance = {torch.bfloat16: 1e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(out.double(), exact, rtol=tolerance, atol=tolerance)


@pytest.mark.kernel
def test_kernel_equals_linear_at_odd_sizes() -> None:
    check(1, 97, 160, torch.bfloat16)  # N and K past whole blocks: masked columns and a masked K tail
    check(3, 40, 512, torch.bfloat16, seed=1)  # K in two whole blocks of 256: the unmasked loads
    check(16, 97, 160, torch.float32, seed=2)  # all 16 rows; float32 dots are IEEE


@pytest.mark.kernel
def test_leading_dimensions_and_the_operator() -> None:
    x, weight = inputs(6, 33, 48, torch.bfloat16, seed=3)
    out = dr.dense_rows_kernel(x.view(3, 2, 48), weight)  # [B, T, K] -> [B, T, N]
    assert out.shape == (3, 2, 33)
    assert torch.equal(out.view(6, 33), dr.dense_rows_kernel(x, weight))
    assert torch.equal(dr.dense_rows(x[:1], weight), dr._dense_rows(x[:1], weight))  # the op's result


def test_more_rows_than_the_kernel_takes_run_the_reference() -> None:
    x, weight = inputs(dr.MAX_ROWS + 1, 24, 32, torch.bfloat16, seed=4)
    assert torch.equal(dr.dense_rows_kernel(x, weight), F.linear(x, weight))
    assert torch.equal(dr.dense_rows(x.cpu(), weight.cpu()), F.linear(x.cpu(), weight.cpu()))


def test_the_operator_compiles_into_one_graph() -> None:
    """Symbolic rows (dynamic=True) through the fake: one graph, no break, F.linear's values."""
    weight = torch.randn(12, 20)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return dr.dense_rows(x * 2, weight).relu()

    explain = torch._dynamo.explain(layer)(torch.randn(3, 1, 20))
    assert explain.graph_count == 1 and explain.graph_break_count == 0
    compiled = torch.compile(layer, backend="aot_eager", dynamic=True, fullgraph=True)
    for rows in (2, 5):
        x = torch.randn(rows, 1, 20)
        torch.testing.assert_close(compiled(x), F.linear(x * 2, weight).relu())


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("n,k", [(12352, 2048), (2048, 4096)])
def test_kernel_equals_linear_at_full_size(rows: int, n: int, k: int) -> None:
    """DeltaNet's packed input projection and an output projection, as a decode step runs them."""
    x, weight = inputs(rows, n, k, torch.bfloat16, seed=rows)
    out = dr.dense_rows(x, weight)
    torch.testing.assert_close(out.float(), F.linear(x, weight).float(), rtol=1e-2, atol=1e-2)
    check(rows, n, k, torch.bfloat16, seed=rows)


@pytest.mark.gpu
def test_a_narrow_weight_takes_cublas_in_the_operator() -> None:
    """The router's 257 columns (under MIN_COLUMNS): too few programs for the kernel, F.linear itself."""
    x, weight = inputs(1, 257, 2048, torch.bfloat16, seed=3)
    assert torch.equal(dr.dense_rows(x, weight), F.linear(x, weight))

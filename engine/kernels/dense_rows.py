"""A dense layer for a few rows: x [..., K] @ weight [N, K]^T, each weight read once at bandwidth.

    out = dense_rows(x, weight)   # x [..., K], weight [N, K] -> [..., N] in x's dtype

Why: a decode step multiplies 1..16 rows (its decoding slots) by every dense weight of the
model, and cuBLAS runs these skinny bfloat16 GEMMs at ~1.7 TB/s on an H100 whose copies
reach ~3.0: a step is bound by reading its weights, so that gap is the step's.

Design choices:
- One program per block of BLOCK_N output columns, looping over K in BLOCK_K steps: it
  loads the rows' x tile [16, BLOCK_K] and the weight tile [BLOCK_N, BLOCK_K], and
  `acc += tl.dot(x, w^T)` on the tensor cores (float32 acc [16, BLOCK_N]; on sm_90 Ampere's
  mma.sync m16n8k16, as Hopper's wgmma wants 64 rows). Each weight element is read by one
  program, once; x is a few KiB that every program reads from L2.
- The rows are padded to 16, the least a dot takes (rows >= M load as 0 and are not
  stored). At M <= 16 the GEMM is memory bound many times over: the padded rows' math is
  free beside the weight's bytes, and the kernel's time does not depend on M.
- `config(N, K)` picks the blocks: BLOCK_N the widest of 64, 32, 16 that still gives at
  least two programs per SM (132 on an H100), so every SM streams weights (12,352 columns:
  32, 386 programs; 2,048: 16, 128 programs); BLOCK_K 256 (fewer, larger pipelined loads;
  the next power of two below that); 4 stages of software pipelining (16-byte cp.async
  copies into shared memory, 48-72 KiB a program) keep several weight tiles in flight per
  program. The bench (engine/bench/dense_cases.py) times alternatives.
- K is not split. Tried (stop 36): where the columns make too few programs, K split so two
  per SM stream the weight, the last program of a column block adding the partial sums in
  order (a ticket counter, one launch). On an H100 every split shape was slower than
  unsplit: outputs 0.0106 against 0.0098 ms, the shared expert's 0.0062 / 0.0049 against
  0.0058 / 0.0035, the head 0.0108 against 0.0089 (`retake bench kernels`).
- N and K are constexprs (a handful of shapes, each compiled once): masks on K vanish when
  BLOCK_K divides it, so the weight loads stay vectorised; N and K need not be multiples
  of the blocks (4,097 candidates, K = 160 in the tests). x may be a strided view (its
  row stride is an argument; a last dimension of stride other than 1 is copied first).
- Measured on the H200 (`retake bench kernels`, 2026-12-05, ms a call at 1 / 8 rows, cuBLAS
  beside): DeltaNet's 12,352 x 2,048 0.0147 / 0.0153 (0.0161 / 0.0162), attention's 9,216 x
  2,048 0.0131 / 0.0135 (0.0121 / 0.0119), the 2,048 x 4,096 outputs 0.0093 (0.0094), the
  shared expert's 1,024 x 2,048 0.0057 (0.0129 / 0.0059), its 2,048 x 512 0.0034 (0.0037),
  the 4,097-candidate head 0.0082 (0.0103 / 0.0256); the router's 257 x 2,048 0.0057 / 0.0060
  (0.0032 / 0.0082): 17 programs cannot stream a weight, so weights under MIN_COLUMNS
  columns take cuBLAS in the operator. A step's dense layers at one row: ~1.44 ms against
  cuBLAS's ~1.78 by those rows (cuBLAS's big ones already run at ~3.1 TB/s there).
- Past MAX_ROWS rows (a prefill chunk, a wide batch), or for dtypes other than bfloat16,
  float16 and float32, the reference runs: cuBLAS is good at real GEMMs.
- `dense_rows_reference` is `F.linear`, the definition. Numerics: float32 accumulation like
  cuBLAS, rounded once to x's dtype; only the summation order differs, so results equal
  F.linear to the output's rounding (bfloat16: ~1 ulp), not bit for bit. float32 inputs
  take IEEE dots (no TF32), and so do bfloat16 tiles in Triton's interpreter, widened first
  (its dots of bfloat16 are wrong); a bfloat16 product is exact in float32 either way.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F

from engine.kernels.fallback import guarded

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None

MAX_ROWS = 16  # rows the kernel takes (a dot's least M, padded); more go to cuBLAS
MIN_COLUMNS = 512  # narrower weights (the router's 257) go to cuBLAS: too few programs to stream at bandwidth
SMS = 132  # an H100's SMs: the blocks are chosen so every one has programs to run
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Triton's interpreter (the CPU tests) keeps bfloat16 as raw uint16 and its dots of them are
# garbage: there the tiles are widened to float32 first (exact) and dotted in float32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


class Config(NamedTuple):
    """The kernel's launch constants."""

    block_n: int
    block_k: int
    stages: int = 4
    warps: int = 4


def config(N: int, K: int) -> Config:
    """The blocks for a weight [N, K]: the widest column block that leaves two programs per SM."""
    block_n = next((b for b in (64, 32) if -(-N // b) >= 2 * SMS), 16)
    block_k = min(256, max(16, 1 << max(0, K - 1).bit_length()))  # K's power of two up to 256
    return Config(block_n, block_k)


def dense_rows_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N]: the definition."""
    return F.linear(x, weight)


if triton is not None:

    @triton.jit
    def _dense_rows_kernel(
        x_ptr, w_ptr, out_ptr,  # x [M, K] (row stride stride_x), weight [N, K] contiguous, out [M, N] contiguous
        M, stride_x,
        N: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        FLOAT32: tl.constexpr,
    ):
        rows = tl.arange(0, ROWS)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        row_in = rows < M
        col_in = cols < N
        x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :]  # [ROWS, BLOCK_K]
        w_ptrs = w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :]  # [BLOCK_N, BLOCK_K]
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)  # out[rows, cols], padded rows included
        for k in range(0, K, BLOCK_K):
            if K % BLOCK_K == 0:  # no mask along K: the loads stay vectorised
                x = tl.load(x_ptrs + k, mask=row_in[:, None], other=0.0)
                w = tl.load(w_ptrs + k, mask=col_in[:, None], other=0.0, eviction_policy="evict_first")
            else:
                k_in = (k + ks) < K
                x = tl.load(x_ptrs + k, mask=row_in[:, None] & k_in[None, :], other=0.0)
                w = tl.load(w_ptrs + k, mask=col_in[:, None] & k_in[None, :], other=0.0,
                            eviction_policy="evict_first")
            if FLOAT32:  # float32 inputs, or bfloat16 in the interpreter (exact products either way)
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        out = out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])


def dense_rows_kernel(x: torch.Tensor, weight: torch.Tensor, launch: Config | None = None) -> torch.Tensor:
    """`dense_rows_reference` as one Triton launch for up to MAX_ROWS rows (`launch`: other
    blocks than `config`'s, for the bench); the reference past that or for other dtypes."""
    N, K = weight.shape
    assert x.shape[-1] == K
    rows = x.reshape(-1, K)  # a view where it can be one (a strided [B, K] view stays one)
    M = rows.shape[0]
    if M > MAX_ROWS or x.dtype not in KERNEL_DTYPES or weight.dtype != x.dtype:
        return dense_rows_reference(x, weight).contiguous()
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    weight = weight.contiguous()  # a no-op for a module's weight
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M and N:
        blocks = launch or config(N, K)
        wide = x.dtype == torch.float32 or (INTERPRETED and x.dtype == torch.bfloat16)
        _dense_rows_kernel[(triton.cdiv(N, blocks.block_n),)](
            rows, weight, out, M, rows.stride(0), N=N, K=K, ROWS=MAX_ROWS, BLOCK_N=blocks.block_n,
            BLOCK_K=blocks.block_k, FLOAT32=wide, num_stages=blocks.stages, num_warps=blocks.warps)
    return out.view(*x.shape[:-1], N)


def _dense_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.is_cuda and triton is not None and weight.shape[0] >= MIN_COLUMNS:
        # the reference from the kernel's first failure on this GPU on
        out = guarded("dense rows", dense_rows_kernel, dense_rows_reference, x, weight)
    else:
        out = dense_rows_reference(x, weight)
    return out.contiguous()  # the layout the fake promises the compiled caller, whichever path ran


# x @ weight^T: the kernel on CUDA (up to MAX_ROWS rows), the reference elsewhere, as one operator:
# torch.compile keeps it inside the compiled decode layers' graphs (an extern call), as moe_routing's.
dense_rows = torch.library.custom_op("retake::dense_rows", _dense_rows, mutates_args=(),
                                     schema="(Tensor x, Tensor weight) -> Tensor")


@dense_rows.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N], contiguous

"""`retake bench kernels`' cases for the few-row dense kernel (engine/kernels/dense_rows.py).

One case per dense weight shape a decode step multiplies, named by role: DeltaNet's packed
q/k/v/z/b/a (`deltanet_in`), full attention's packed q+gate/k/v (`attention_in`), the
layers' output projections (`out`: DeltaNet's out_proj and attention's o_proj, one case
where their shapes agree, as at the full size), the shared expert's packed gate+up and its
down projection, the router with the shared expert's gate (`router`), the main token's
candidate head (`head`), and the tower's feed-forward down projection (`tower_down`, 13 a
step: its other weights have the backbone's shapes at the full size); then the largest
shape with other blocks than `config`'s (`deltanet_in bn64 bk256`, ...), and the narrow
weights (2,048 columns or fewer: the outputs and the shared expert's at 2.3x, 5.6x and 6.7x
their floor on the H200, stop 35) with more bytes in flight per program (`out bn16 bk512 s4
w8`: a wider K block, more stages, more warps; their few programs, one per SM or less, are
latency-bound), so one GPU run tells which blocks are best.

Design choices:
- The kernel is called directly (not the operator): a kernel that cannot build fails the
  bench instead of timing the fallback. Its reference is F.linear (cuBLAS), graphed too.
- Every call reads its own copy of the weight (cases.py's `copies_for`): a step reads each
  weight once, cold. The floor's bytes are the weight, x and the output.
- Only batches the kernel takes (rows <= MAX_ROWS): past them it is F.linear itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.drama3.config import Drama3Config

if TYPE_CHECKING:
    from engine.bench.cases import Case
    from engine.kernels.dense_rows import Config

SWEEP = ((64, 256), (16, 256), (32, 128))  # (block_n, block_k) to compare with `config`'s on the largest weight
# weights of at most 2 programs per SM
NARROW = ("out", "deltanet_out", "attention_out", "shared_up", "shared_down", "tower_down")
# (block_n, block_k, stages, warps) for the narrow ones: more of their weight in flight per program
NARROW_SWEEP = ((16, 512, 4, 4), (16, 512, 4, 8), (16, 256, 6, 4), (16, 256, 8, 8), (16, 128, 8, 4))


def dense_shapes(config: Drama3Config) -> list[tuple[str, int, int, int]]:
    """(role, N, K, calls per decode step) of each dense weight a decode step multiplies."""
    text = config.text
    D = text.hidden_size
    linear, full = len(text.linear_attention_layers), len(text.full_attention_layers)
    value_width = text.linear_num_value_heads * text.linear_value_head_dim
    deltanet_in = 2 * text.linear_key_dim + 2 * value_width + 2 * text.linear_num_value_heads  # qkv, z, b, a
    attention_width = text.num_attention_heads * text.head_dim
    attention_in = 2 * attention_width + 2 * text.num_key_value_heads * text.head_dim  # q + gate, k, v
    if value_width == attention_width:
        outs = [("out", D, value_width, linear + full)]
    else:
        outs = [("deltanet_out", D, value_width, linear), ("attention_out", D, attention_width, full)]
    layers, shared = text.num_hidden_layers, text.shared_expert_intermediate_size
    tower = config.tower  # its layers' wide-K weights (eh_proj and wo are `out`'s shape at the full size)
    tower_layers = tower.n_layer + tower.residual_layers
    return [("deltanet_in", deltanet_in, D, linear), ("attention_in", attention_in, D, full), *outs,
            ("shared_up", 2 * shared, D, layers), ("shared_down", D, shared, layers),
            ("router", text.num_experts + 1, D, layers), ("head", config.codebook_size + 1, D, 1),
            ("tower_down", tower.dim, tower.intermediate_size, tower_layers)]


def dense_cases(config: Drama3Config, rows: int, device: torch.device) -> list[Case]:
    """Each dense weight at `rows` rows, then the largest with the SWEEP's blocks."""
    from engine.kernels import dense_rows as dr

    if rows > dr.MAX_ROWS:
        return []
    shapes = dense_shapes(config)
    role, N, K, per_step = max(shapes, key=lambda shape: shape[1] * shape[2])
    sweep = [dense_case(f"{role} bn{bn} bk{bk}", N, K, per_step, rows, device, dr.Config(bn, bk))
             for bn, bk in SWEEP]
    narrow = [dense_case(f"{role} bn{bn} bk{bk} s{stages} w{warps}", N, K, per_step, rows, device,
                         dr.Config(bn, bk, stages, warps))
              for role, N, K, per_step in shapes if role in NARROW
              for bn, bk, stages, warps in sorted({(bn, min(bk, 1 << (K - 1).bit_length()), stages, warps)
                                                   for bn, bk, stages, warps in NARROW_SWEEP} - {dr.config(N, K)})]
    return [*(dense_case(*shape, rows, device) for shape in shapes), *sweep, *narrow]


def dense_case(role: str, N: int, K: int, per_step: int, rows: int, device: torch.device,
               launch: Config | None = None) -> Case:
    from engine.bench.cases import Case, copies_for
    from engine.kernels import dense_rows as dr

    copies = copies_for(N * K * 2)
    weights = [(torch.randn(N, K, device=device) * K**-0.5).bfloat16() for _ in range(copies)]
    x = torch.randn(rows, K, device=device).bfloat16()
    moved = (N * K + rows * K + rows * N) * 2
    return Case(f"dense_rows {role}", rows, per_step, moved, copies,
                lambda i: dr.dense_rows_kernel(x, weights[i], launch), lambda i: F.linear(x, weights[i]))

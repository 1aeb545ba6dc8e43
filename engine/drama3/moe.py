"""The backbone's mixture of experts: routed SwiGLU experts plus a gated shared expert.

    weights, experts = top_k(softmax(gate(x)))    # float32, renormalised over the top k
    y = sum_j weights_j * expert_j(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)

Design choices:
- Expert weights are stacked per layer, gate and up fused as in fused-MoE kernels:
  `w13` [E, 2I, D] (gate rows, then up rows) and `w2` [E, D, I]. The checkpoint stores one
  tensor per expert and projection; the loader's rename table fills the stacks.
- Block-FP8 checkpoints (`quantization_config` bsgemm-moe) keep the experts FP8
  (float8_e4m3fn buffers) with float32 `*_scale_inv` [E, rows/128, cols/128]: a weight is
  `fp8 * scale_inv` of its 128x128 block. This plain-torch path dequantises only the
  experts a call uses; a GPU kernel can read the same FP8 buffers and scales. On a CPU a
  small layer (the tiny demo's) keeps its experts dequantised once (`dequantized`, again
  after a load or any in-place change): dequantising them every call was ~2/3 of a tiny
  16-take step on 2 cores (87.6 -> 58.8 ms a step).
- Two ways to run the routed experts, same maths (tested equal): `experts_gathered`
  gathers each (row, expert) pair's weights (no host sync, fixed shapes: what a
  CUDA-graph decode step needs, cheap for a few rows) and `experts_grouped` runs each
  routed expert once over its rows (cheap for a long prefill, but it syncs to find them).
  `Experts.forward` picks by the number of (row, expert) pairs.
- On a GPU, FP8 experts run as released instead: W8A8 (activations quantised per token
  and 128-channel group), the Triton kernel of engine/kernels/fp8_moe.py, which reads the
  same buffers (graph-safe for a few rows). The plain paths above are its CPU stand-in
  (weights dequantised, activations not quantised); `w8a8 = False` runs them on a GPU
  too, for numerics checks: a float8 rounding of the activations turns a one-ulp
  difference upstream into a ~1e-3 one (engine/bench/numerics.py).
- Linears that read the same input have a `project` method: the router `gate` with
  `shared_expert_gate`, and the shared expert's gate_proj with up_proj. The fast path
  (fast.py `fuse_projections`) replaces each with one GEMM over the stacked weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.drama3.config import FP8_BLOCK, TextConfig
from engine.drama3.fp8 import dequantize_fp8

GATHER_MAX_PAIRS = 64  # (row, expert) pairs up to which a call gathers per-pair weights
DEQUANTIZED_MAX_BYTES = 64 * 2**20  # a CPU layer's experts kept dequantised up to this size (the tiny demo's)


class Experts(nn.Module):
    """The routed experts of one layer, stacked: w13 [E, 2I, D], w2 [E, D, I]."""

    w13: torch.Tensor  # [E, 2I, D]: parameters, or FP8 buffers with float32 scales w13_scale_inv
    w2: torch.Tensor  # [E, D, I]
    w13_scale_inv: torch.Tensor  # [E, 2I/128, D/128], FP8 only
    w2_scale_inv: torch.Tensor  # [E, D/128, I/128]

    def __init__(self, config: TextConfig, fp8: bool) -> None:
        super().__init__()
        E, I, D = config.num_experts, config.moe_intermediate_size, config.hidden_size  # noqa: E741 - the paper's I
        self.fp8 = fp8
        self._dequantized: tuple[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] | None = None
        self._register_load_state_dict_pre_hook(self.forget_dequantized)  # type: ignore[no-untyped-call]  # a load copies into the buffers
        self.w8a8 = True  # FP8 experts on CUDA: the W8A8 kernel (False: dequantised weights, float activations)
        if fp8:
            block_rows, block_cols = FP8_BLOCK
            fp8_dtype = torch.float8_e4m3fn
            self.register_buffer("w13", torch.zeros(E, 2 * I, D, dtype=fp8_dtype))
            self.register_buffer("w13_scale_inv", torch.zeros(E, 2 * I // block_rows, D // block_cols,
                                                              dtype=torch.float32))
            self.register_buffer("w2", torch.zeros(E, D, I, dtype=fp8_dtype))
            self.register_buffer("w2_scale_inv", torch.zeros(E, D // block_rows, I // block_cols,
                                                             dtype=torch.float32))
        else:
            self.w13 = nn.Parameter(torch.zeros(E, 2 * I, D))
            self.w2 = nn.Parameter(torch.zeros(E, D, I))

    def weights(self, experts: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """w13 [..., 2I, D] and w2 [..., D, I] of the experts indexed by `experts`, in dtype."""
        if self.fp8:
            if (whole := self.dequantized(dtype)) is not None:
                return whole[0][experts], whole[1][experts]
            return (dequantize_fp8(self.w13[experts], self.w13_scale_inv[experts], dtype),
                    dequantize_fp8(self.w2[experts], self.w2_scale_inv[experts], dtype))
        return self.w13[experts].to(dtype), self.w2[experts].to(dtype)

    def forget_dequantized(self, *_: object) -> None:
        self._dequantized = None

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every expert's FP8 weights in dtype, dequantised once while the buffers stay as they are,
        for a small layer on a CPU (the tiny demo: its steps dequantised them every call, ~2/3 of a
        step on 2 cores); None elsewhere (a GPU runs the FP8 kernel; a large layer would not fit)."""
        size = (self.w13.numel() + self.w2.numel()) * dtype.itemsize
        if self.w13.is_cuda or size > DEQUANTIZED_MAX_BYTES or torch.compiler.is_compiling():
            return None  # (compiled layers trace the plain path: no guards on a cache)
        buffers = (self.w13, self.w13_scale_inv, self.w2, self.w2_scale_inv)
        # An in-place change (not of inference tensors, which keep no version) or new buffers: again.
        key = (dtype, *(b.data_ptr() for b in buffers), *(None if b.is_inference() else b._version for b in buffers))
        if self._dequantized is None or self._dequantized[0] != key:
            self._dequantized = (key, (dequantize_fp8(self.w13, self.w13_scale_inv, dtype),
                                       dequantize_fp8(self.w2, self.w2_scale_inv, dtype)))
        return self._dequantized[1]

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, D], experts and weights [N, k] -> [N, D]."""
        if self.fp8 and self.w8a8 and x.is_cuda:  # as released: W8A8 block-FP8 GEMMs on the tensor cores
            from engine.kernels.fp8_moe import fp8_moe

            return fp8_moe(x, self.w13, self.w13_scale_inv, self.w2, self.w2_scale_inv, experts, weights)
        run = experts_gathered if experts.numel() <= GATHER_MAX_PAIRS else experts_grouped
        return run(self, x, experts, weights)


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x [..., M, D] through w13 [..., 2I, D] and w2 [..., D, I] -> [..., M, D]."""
    gate, up = (x @ w13.transpose(-1, -2)).chunk(2, dim=-1)  # [..., M, I] each
    return (F.silu(gate) * up) @ w2.transpose(-1, -2)


def experts_gathered(experts: Experts, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    N, k = index.shape
    w13, w2 = experts.weights(index.flatten(), x.dtype)  # [N*k, 2I, D], [N*k, D, I]
    pairs = x.repeat_interleave(k, dim=0)[:, None]  # [N*k, 1, D]
    out = swiglu(pairs, w13, w2).view(N, k, -1)  # [N, k, D]
    return (out * weights[..., None].to(out.dtype)).sum(1)


def experts_grouped(experts: Experts, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for expert in index.unique().tolist():
        rows, choice = (index == expert).nonzero(as_tuple=True)
        w13, w2 = experts.weights(torch.tensor(expert, device=x.device), x.dtype)
        y = swiglu(x[rows], w13, w2) * weights[rows, choice, None].to(x.dtype)  # [rows, D]
        out.index_add_(0, rows, y)
    return out


def top_experts(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> the k most probable experts [N, k] (int64, most probable
    first) and their float32 weights [N, k], renormalised over those k."""
    probs = torch.softmax(logits.float(), dim=-1)  # [N, E]
    weights, experts = probs.topk(k, dim=-1)  # [N, k] each, descending
    return experts, weights / weights.sum(-1, keepdim=True)


class MLP(nn.Module):
    """The shared expert: a SwiGLU with checkpoint names gate_proj, up_proj, down_proj."""

    projections = ("gate_proj", "up_proj")  # the linears of `project`, in its order

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> gate and up [N, I] (one GEMM once fused)."""
        return self.gate_proj(x), self.up_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.project(x)
        y: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return y


class SparseMoE(nn.Module):
    """`mlp` of a backbone layer: router `gate`, `experts`, `shared_expert`, `shared_expert_gate`."""

    projections = ("gate", "shared_expert_gate")  # the linears of `project`, in its order

    def __init__(self, config: TextConfig, fp8: bool) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config, fp8)
        self.shared_expert = MLP(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> router logits [N, E] and the shared expert's gate logit [N, 1] (one GEMM once fused)."""
        return self.gate(x), self.shared_expert_gate(x)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> experts [N, k] and their renormalised float32 weights [N, k]."""
        return self.top_experts(self.gate(x))

    def top_experts(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [N, E] -> experts [N, k] and their renormalised float32 weights [N, k]
        (the fast path may replace this with engine/kernels/moe_routing.py's kernel)."""
        return top_experts(logits, self.top_k)

    def routed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> the routed experts' weighted sum [N, D] and the shared expert's gate logit [N, 1]."""
        router_logits, shared_logit = self.project(x)
        experts, weights = self.top_experts(router_logits)
        routed: torch.Tensor = self.experts(x, experts, weights)
        return routed, shared_logit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(0, -2)  # [N, D]
        routed, shared_logit = self.routed(flat)
        shared: torch.Tensor = self.shared_expert(flat)  # [N, D]
        return (routed + torch.sigmoid(shared_logit) * shared).view_as(x)

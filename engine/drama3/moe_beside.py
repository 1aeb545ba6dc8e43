"""The shared expert beside the routed experts: two streams in one MoE layer.

    install_beside(moe)        # moe.forward: the routed experts on the caller's stream, the
                               # shared expert on a side stream, joined before the sum
    BESIDE.on = False          # the same operator with both on the caller's stream (the bench's A/B)

Why: at one decoding row a MoE layer's two halves are each a chain of small kernels bound by
latency, not bandwidth: the router GEMM, the routing, and the five launches of the FP8 experts
(~25 us on the H200 for ~24 MB of weights) on one side; the shared expert's gate/up GEMM, its
SiLU product and its down GEMM (~10 us, 6 MB) on the other. Neither reads what the other
writes, so in the decode step's CUDA graph they can be two branches that run at once: the
shared expert hides behind the routed one, ~10 us in each of 40 layers.

Design choices:
- One torch operator per call (`retake::moe_beside`), as the step's kernels are: the compiled
  decode layers keep it inside their graph (no graph break), and the streams live in its eager
  body, where a CUDA-graph capture records the fork and the join as branches of the graph
  (the side stream waits on the caller's, the caller on the side's: stream capture follows
  the events, and the allocator hands the side's blocks from the graph's pool). The operator
  returns the routed sum, the shared expert's output and its gate logit; the caller's compiled
  code adds `routed + sigmoid(logit) * shared`, fused with the residual and the next norm as before.
- The operator finds its layer by the router's weight, which it is given (an operator takes
  tensors, not modules): a registry of weak references keyed by that weight's address. A
  number per layer would not do: torch.compile guards on it, and the decode layers, which share
  one compile per kind, compiled once per MoE layer (test_compiles.py). Its body calls the
  layer's own methods, so the kernels installed into it (dense rows, routing, FP8 experts) run
  as they would in line, and the arithmetic is SparseMoE.forward's to the last rounding of the sum.
- Intermediates made on the side stream are recorded on the caller's before it uses them, so
  eager calls (warm-up, prefill) never hand a block back to the allocator while the other
  stream still reads it. On a CPU there is one stream: the body runs both halves in order.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from engine.drama3.moe import SparseMoE

_layers: dict[int, weakref.ref[SparseMoE]] = {}  # by the address of the router's weight
_side: dict[torch.device, torch.cuda.Stream] = {}


@dataclass
class Beside:
    on: bool = True  # False: both halves on the caller's stream (same operator, same kernels)


BESIDE = Beside()


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of a device (one for every layer: the layers run one after another)."""
    if device not in _side:
        _side[device] = torch.cuda.Stream(device)
    return _side[device]


def _moe_beside(x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ref = _layers.get(gate.data_ptr())
    moe = ref() if ref is not None else None
    if moe is None or moe.gate.weight.data_ptr() != gate.data_ptr():
        raise RuntimeError("moe_beside: no installed MoE layer has this router weight (install after fusing)")
    # The logit is a column of the packed router's output (stride E + 1): contiguous, as the fake
    # promises (Inductor checks the strides: 2 rows and more failed there on the H100, stop 40).
    if not (x.is_cuda and BESIDE.on):
        routed, logit = moe.routed(x)
        return routed, moe.shared_expert(x), logit.contiguous()
    main, side = torch.cuda.current_stream(x.device), side_stream(x.device)
    side.wait_stream(main)  # the fork: x is written on the caller's stream
    with torch.cuda.stream(side):
        shared = moe.shared_expert(x)  # [N, D]
    routed, logit = moe.routed(x)  # [N, D], [N, 1]
    main.wait_stream(side)  # the join
    shared.record_stream(main)
    return routed, shared, logit.contiguous()


# x [N, D] -> the routed experts' sum [N, D], the shared expert's output [N, D], its gate logit [N, 1]
# (gate: the layer's router weight [E, D], which names the layer)
moe_beside = torch.library.custom_op("retake::moe_beside", _moe_beside, mutates_args=(),
                                     schema="(Tensor x, Tensor gate) -> (Tensor, Tensor, Tensor)")


@moe_beside.register_fake
def fake_outputs(x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs' shapes and layout, as compiled callers see them: contiguous, each."""
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty((*x.shape[:-1], 1))


def install_beside(moe: SparseMoE) -> None:
    """Shadow `moe.forward` with the operator (once; after `fuse_projections`, which moves the weights)."""
    if "forward" in vars(moe):
        return
    _layers[moe.gate.weight.data_ptr()] = weakref.ref(moe)  # (a later layer at a freed one's address replaces it)

    def forward(x: torch.Tensor) -> torch.Tensor:
        routed, shared, logit = moe_beside(x.flatten(0, -2), moe.gate.weight)
        out: torch.Tensor = (routed + torch.sigmoid(logit) * shared).view_as(x)
        return out

    vars(moe)["forward"] = forward

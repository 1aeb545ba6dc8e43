"""The GPU fast path of Drama 3: kernels installed into a built model.

    fuse_projections(model)                      # one GEMM per group of linears over one input (any device)
    install_fast_path(model)                     # fused projections, fla prefill, the kernels, compiled layers
    install_fast_path(model, kernels=("deltanet_step", "add_rms_norm"))   # kernels picked (KERNELS)

The decode step's CUDA graphs are the Decoder's (decoder.py, engine/graphs.py).

Design choices:
- Serving concerns are transformations of an already-built model (gpt-fast's
  `apply_tp`, `replace_linear_int8`): the model files know nothing of kernels or graphs,
  and the eager path stays available and identical (tests compare the two).
- Projections that read the same input run as one GEMM over their stacked weights
  (nano-vllm's packed modules, done after loading): DeltaNet qkv/z/b/a, attention q/k/v,
  router gate + shared-expert gate, shared-expert gate/up, tower w1/w3. A module lists
  them in its `projections` and runs them in `project`; `fuse_projections` replaces that
  method with a `PackedLinear`. The stacked weight owns the memory and each Linear's
  weight becomes a view of its rows, so nothing is stored twice and `state_dict` keeps
  the checkpoint's names, shapes and dtypes (the stacked weight is a non-persistent
  buffer). Fuse on the model's final device: `.to()` afterwards copies the views apart.
- Gated DeltaNet prefill runs flash-linear-attention's chunked kernel; one-row decode
  calls run the whole step between the projections and `out_proj` (conv state, gated
  delta rule, gated norm) as two Triton launches per layer (engine/kernels/deltanet_step.py,
  tested against its torch reference and the layer). It is a torch operator, as the
  routing and attention kernels are: the compiled layers keep each inside their graph (a
  Python call behind `torch.compiler.disable` broke each layer's graph in two, splitting
  Inductor's fusions and multiplying the warm-up's compiles; test_compiles.py counts).
- Each Triton kernel of the step is selectable (`kernels`, `retake bench decode
  --kernels`), so each is measured in the step against the step without it. By default
  the residual add + RMSNorm stays torch code: in the compiled decode layers Inductor
  fuses each norm with the add before it, which is what engine/kernels/norm.py's kernel
  does; `add_rms_norm` puts the kernel (a graph break: it is not an operator) at the
  layers' `RMSNorm.add` instead. `moe_routing` (on by default) runs each MoE layer's
  router softmax, top-8 and renormalisation as one launch (engine/kernels/moe_routing.py)
  instead of ~6 (torch.topk alone is a gather and a sort). `cache_attention` (on by
  default) runs the one-row attention of each backbone full-attention layer and each tower
  layer as a split-K kernel reading each row's own rows straight from the cache
  (engine/kernels/cache_attention.py) instead of gathering the KV bucket and masking it (on
  the H200 ~0.5 ms of a 5.7 ms step; a row's cost follows its own history, not the bucket).
  The block-FP8 W8A8 experts always run their kernel on CUDA (moe.py).
- `dense_rows` (on by default) runs every bias-free dense layer through
  engine/kernels/dense_rows.py's operator: a decode step's 1..16 rows stream each weight
  once through a Triton kernel (on the H200 ~1.44 ms of a one-row step's dense layers
  against cuBLAS's ~1.78); more rows, and the router's narrow weight, stay cuBLAS's. PackedLinear takes its
  GEMM as `matmul`, each other Linear's forward and the candidate head are shadowed.
- Prefill chunks run their layers eagerly inside a CUDA graph (every small op a kernel of a
  few microseconds): `prefill_norms` (on by default, not with compiled prefill layers) makes
  each norm of a chunk one launch of norm.py's kernel (with the residual add, a rope, a
  gate), and each DeltaNet layer's rule inputs one of engine/kernels/deltanet_inputs.py.
- Decode calls (one row per slot) of every backbone and tower layer run torch.compile'd
  code (Inductor fuses the norms, rope, gates and the DeltaNet step into a few kernels),
  compiled with symbolic sizes from the start (one compile serves every row and KV bucket);
  calls over many rows (prefill) stay eager, so prompts of any length never recompile. A
  mixed step (mixed.py) runs each backbone layer's two halves apart: `mix_of` its first.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.drama3.backbone import DecoderLayer, GatedAttention
from engine.drama3.deltanet import GatedDeltaNet, GatedRMSNorm, recurrent_delta_rule
from engine.drama3.layers import RMSNorm
from engine.drama3.model import Drama3Model
from engine.drama3.moe import SparseMoE
from engine.drama3.tower import TowerAttention, TowerBlock
from engine.kernels.fallback import guarded

Layer = TypeVar("Layer", bound=Callable[..., Any])  # a layer's forward (or `mix`), compiled as itself


class PackedLinear(nn.Module):
    """Bias-free linears over one input as one GEMM: `weight` [sum N_i, D] stacks theirs.

    Each Linear's weight is re-pointed to a view of its rows (same storage), so the
    model holds every weight once and keeps its checkpoint names."""

    weight: torch.Tensor

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        if any(linear.bias is not None for linear in linears):
            raise ValueError("PackedLinear packs bias-free linears only")
        with torch.no_grad():
            weight = torch.cat([linear.weight for linear in linears])  # [sum N_i, D], their dtype
        self.register_buffer("weight", weight, persistent=False)  # state_dict keeps the views' names
        self.sizes = [linear.out_features for linear in linears]
        self.matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear  # x, weight -> x @ weight^T
        for linear, rows in zip(linears, weight.split(self.sizes)):
            linear.weight = nn.Parameter(rows, requires_grad=False)  # a view: the old tensor is freed

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [..., D] -> one [..., N_i] view per packed linear, in their order."""
        return tuple(self.matmul(x, self.weight).split(self.sizes, dim=-1))


def fuse_projections(model: nn.Module) -> int:
    """Run each module's `projections` as one GEMM (see the module docstring); return how
    many modules were fused now (0 when called again)."""
    fused = 0
    for module in list(model.modules()):
        names = getattr(type(module), "projections", None)
        if names is None or isinstance(getattr(module, "packed", None), PackedLinear):
            continue
        packed = PackedLinear([getattr(module, name) for name in names])
        module.packed = packed
        vars(module)["project"] = packed.forward  # shadows the class's `project` (the separate linears)
        fused += 1
    return fused


def fla_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`gated_delta_rule` with flash-linear-attention's chunked kernel for many rows."""
    if q.shape[1] == 1:
        return recurrent_delta_rule(q, k, v, g, beta, state)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dtype = torch.bfloat16  # fla's tensor-core path; its state and accumulation stay float32
    out, final = chunk_gated_delta_rule(q.to(dtype), k.to(dtype), v.to(dtype), g.float(), beta.to(dtype),
                                        scale=1.0, initial_state=state.float(), output_final_state=True)
    return out.float(), final.float()


def layer_compiled(forward: Layer, prefill: bool, backend: str = "inductor") -> Layer:
    """`forward` compiled for one-row calls ([B, D] or [B, 1, D]); calls over many rows
    (prefill chunks) run eagerly, or compiled with a symbolic row count if `prefill`.
    (`backend`: tests count compiles with a cheaper one; the guards are the same.)"""
    # Symbolic from the first call: the row buckets' batch sizes and the KV buckets share one
    # compile (batch 1 stays its own, as torch specialises sizes 0 and 1). With dynamic=None
    # each layer compiled up to three times (static, then the KV length, then the batch; the
    # first took 70 s at the full size): the likeliest reason the server's warm-up ran past
    # 200 s on the H200 (docs/perf.md, not yet measured apart: warm-up now logs each phase).
    decode = torch.compile(forward, dynamic=True, backend=backend)
    rows = torch.compile(forward, dynamic=True, backend=backend) if prefill else forward

    def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        one_row = x.dim() == 2 or x.shape[1] == 1
        return (decode if one_row else rows)(x, *args, **kwargs)

    return cast(Layer, run)


Mix = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # a backbone layer's first half (DecoderLayer.mix)
MIXES: weakref.WeakKeyDictionary[DecoderLayer, Mix] = weakref.WeakKeyDictionary()


def mix_of(layer: DecoderLayer) -> Mix:
    """`layer.mix` as the fast path runs the layer: compiled where it compiled the layers (many
    rows only with `compile_prefill`), else the layer's own."""
    return MIXES.get(layer, layer.mix)


CACHE_DIMS = {"k": (0, 1), "v": (0, 1), "conv_state": (0,), "recurrent_state": (0,), "rope": (0,)}  # slots, rows


def caches_symbolic(model: Drama3Model) -> None:
    """Mark the caches' slot and row dimensions symbolic for the compiled decode layers and
    every other size of the model's tensors static, so a decoder of other sizes (a bench's
    parts, a test's) reuses their compile: the layers read the caches as module buffers,
    which torch.compile otherwise takes as static shapes (each new decoder size recompiled
    every layer: a minute at the full size). Weights stay static (kernels specialised to
    their sizes). Only read by torch.compile (install_fast_path lets it honour the marks)."""
    import torch._dynamo

    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        dynamic = CACHE_DIMS.get(name.rsplit(".", 1)[-1], ())
        for dim in range(tensor.dim()):
            if dim in dynamic:
                torch._dynamo.mark_dynamic(tensor, dim)
            else:
                torch._dynamo.mark_static(tensor, dim)


def cache_decode(module: GatedAttention | TowerAttention) -> Callable[..., torch.Tensor]:
    """`module.attend_cache` (a backbone full-attention layer's or a tower layer's) with one-row
    calls through engine/kernels/cache_attention.py: each row reads its own slot's rows up to
    its position, straight from the cache. The kernel is one operator to torch.compile (no
    graph break); should it fail on this GPU, its reference runs from then on (fallback.py)."""
    from engine.kernels.cache_attention import cache_attention

    plain = module.attend_cache

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
            kv_len: int | None) -> torch.Tensor:
        cache = module.kv_cache
        if q.shape[1] != 1 or cache is None:
            return plain(q, k, v, input_pos, slots, kv_len)
        cache.write(k, v, input_pos, slots)
        out: torch.Tensor = cache_attention(q[:, 0], cache.k, cache.v, slots, input_pos[:, 0])
        return out[:, None]  # [B, 1, H, Dh]

    return run


def reads_own_rows(model: Drama3Model) -> bool:
    """Every attention layer's one-row calls read each row's own rows (`cache_attention`
    installed in all of them): a decode step then costs the same at every KV bucket."""
    layers = [m for m in model.modules() if isinstance(m, (GatedAttention, TowerAttention))]
    return bool(layers) and all("attend_cache" in vars(m) for m in layers)


def deltanet_decode(layer: GatedDeltaNet) -> Callable[..., torch.Tensor]:
    """`layer.forward` with one-row calls ([B, 1, D]) through the decode-step kernel."""
    from engine.kernels.deltanet_step import deltanet_step

    forward = layer.forward

    def run(x: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
            valid: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[1] != 1 or valid is not None:
            return forward(x, input_pos, slots, valid)
        mixed, z, b, a = layer.project(x)  # [B, 1, C], [B, 1, Hv*Dv], [B, 1, Hv] x 2
        out = deltanet_step(layer, mixed[:, 0], z[:, 0], b[:, 0], a[:, 0], input_pos[:, 0], slots)  # [B, Hv*Dv]
        y: torch.Tensor = layer.out_proj(out)[:, None]  # [B, 1, D]
        return y

    return run


def norm_kernel(norm: RMSNorm) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`norm.add` (a residual add and the norm after it) as one launch of the fused kernel."""
    from engine.kernels.norm import add_rms_norm

    add = norm.add

    def launch(x: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype != update.dtype or x.shape != update.shape:  # the kernel rounds the sum to one dtype
            return add(x, update)
        return add_rms_norm(x, update, norm.weight, norm.eps)

    return cast(Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                torch.compiler.disable(launch))  # compiled callers break around it


def many_rows(x: torch.Tensor) -> bool:
    """A prefill chunk's call ([B, T, ...] with T > 1), not a decode step's ([B, D], [B, 1, ...])."""
    return x.dim() >= 3 and x.shape[1] > 1


class NormRows:
    """`norm.forward`, `norm.add` and `norm.rotated` with a prefill chunk's calls as one launch of
    norm.py's kernel each (eager torch launches ~9-11 a norm: casts, square, mean, rsqrt,
    scales; ~10 more for a rope); a decode step's calls keep the module's code, which the
    compiled layers fuse with their neighbours."""

    def __init__(self, norm: RMSNorm) -> None:
        self.norm, self.plain, self.plain_add, self.plain_rotated = norm, norm.forward, norm.add, norm.rotated

    def install(self) -> None:
        vars(self.norm).update(forward=self.forward, add=self.add, rotated=self.rotated)  # shadow RMSNorm's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from engine.kernels.norm import rms_norm_kernel, rms_norm_reference

        if not many_rows(x):
            return self.plain(x)
        out: torch.Tensor = guarded("RMSNorm", rms_norm_kernel, rms_norm_reference, x, self.norm.weight,
                                    self.norm.eps)
        return out

    def add(self, x: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from engine.kernels.norm import add_rms_norm_kernel, add_rms_norm_reference

        if not many_rows(x) or x.dtype != update.dtype or x.shape != update.shape:
            return self.plain_add(x, update)
        return guarded("RMSNorm", add_rms_norm_kernel, add_rms_norm_reference, x, update, self.norm.weight,
                       self.norm.eps)

    def rotated(self, x: torch.Tensor, rope: torch.Tensor, interleaved: bool) -> torch.Tensor:
        from engine.kernels.norm import rotated_rms_norm_kernel, rotated_rms_norm_reference

        if not many_rows(x) or x.dim() != 4:
            return self.plain_rotated(x, rope, interleaved)
        out: torch.Tensor = guarded("rotated RMSNorm", rotated_rms_norm_kernel, rotated_rms_norm_reference, x,
                                    self.norm.weight, self.norm.eps, rope, interleaved)
        return out


def gated_norm_rows(norm: GatedRMSNorm) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`norm.forward` (a DeltaNet layer's gated output norm) with a prefill chunk's calls as one
    launch of norm.py's kernel (eager torch launches ~11)."""
    from engine.drama3.deltanet import gated_rms_norm
    from engine.kernels.norm import gated_rms_norm_kernel

    forward = norm.forward

    def run(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if not many_rows(x) or x.shape != z.shape:
            return forward(x, z)
        out: torch.Tensor = guarded("gated RMSNorm", gated_rms_norm_kernel, gated_rms_norm, x, z, norm.weight,
                                    norm.eps)
        return out

    return run


def deltanet_inputs(layer: GatedDeltaNet) -> Callable[..., tuple[torch.Tensor, ...]]:
    """`layer.rule_inputs` with a prefill chunk's calls as one launch of
    engine/kernels/deltanet_inputs.py (q, k, v in bfloat16: only with the bfloat16 chunked rule)."""
    from engine.kernels.deltanet_inputs import deltanet_inputs_kernel

    plain = layer.rule_inputs

    def kernel(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
               valid: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        return deltanet_inputs_kernel(mixed, b, a, valid, layer.A_log, layer.dt_bias, layer.k_heads, layer.k_dim)

    def run(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
            valid: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        if not many_rows(mixed):
            return plain(mixed, b, a, valid)
        return guarded("DeltaNet inputs", kernel, plain, mixed, b, a, valid)

    return run


def install_dense_rows(model: nn.Module) -> None:
    """Every bias-free dense layer (a PackedLinear's GEMM, each other Linear, the candidate head) through
    engine/kernels/dense_rows.py's operator: up to 16 rows (a decode step's slots) its
    weight-streaming kernel, more rows (prefill chunks) cuBLAS as before."""
    from engine.kernels.dense_rows import dense_rows

    if isinstance(model, Drama3Model) and "candidate_logits" not in vars(model):
        vars(model)["candidate_logits"] = lambda hidden: dense_rows(hidden, model.candidate_head).float()
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.matmul = dense_rows
        elif isinstance(module, nn.Linear) and module.bias is None and "forward" not in vars(module):
            vars(module)["forward"] = lambda x, linear=module: dense_rows(x, linear.weight)  # shadows Linear.forward


def routing_kernel(moe: SparseMoE) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`moe.top_experts` (softmax, top k, renormalise) as one launch of the routing kernel."""
    from engine.kernels.moe_routing import route

    k = moe.top_k

    def run(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        experts, weights = route(logits, k)
        return experts, weights

    return run


KERNELS = ("deltanet_step", "add_rms_norm", "moe_routing", "cache_attention", "prefill_norms",  # Triton kernels
           "dense_rows", "shared_beside")
# cache_attention: on, from the kernel's own H200 figures (above). moe_routing: on; one launch where
# the reference makes ~6 in each of the 40 MoE layers (~0.75 ms of a step in stop 27's profile); as a
# torch operator it adds no graph break (test_compiles.py).
# add_rms_norm: Inductor fuses the compiled layers' norms already. prefill_norms: the eager prefill
# chunk's ~220 norms (full size; 30 of them DeltaNet's gated ones, 46 q/k norms with their rope)
# one launch each instead of ~9-21 (not with --compile-prefill, whose compiled layers fuse them).
# dense_rows: on (above; the graphed H200 step with it 4.966 ms). shared_beside: on; each MoE layer's
# shared expert on a side stream beside the routed experts (moe_beside.py): stop 41's H100 graphed
# step 5.111 ms with it, 5.437 with both halves in line.
DEFAULT_KERNELS = ("deltanet_step", "moe_routing", "cache_attention", "prefill_norms", "dense_rows", "shared_beside")


def install_fast_path(model: Drama3Model, *, compile_layers: bool = True, compile_prefill: bool = False,
                      kernels: Iterable[str] = DEFAULT_KERNELS) -> list[str]:
    """Install the GPU fast path into `model` (a no-op on CPU); return what was installed.

    compile_prefill (off by default until measured, see docs/perf.md) also compiles the
    layers for prefill chunks: eager prefill launches every small op from Python.
    kernels: which of KERNELS to install (tests leave them out of a reference)."""
    kernels = tuple(kernels)
    if unknown := [name for name in kernels if name not in KERNELS]:
        raise ValueError(f"unknown decode kernels {unknown}; choose from {', '.join(KERNELS)}")
    installed: list[str] = []
    if model.candidate_head.device.type != "cuda":
        return installed
    fuse_projections(model)  # before compiling: the compiled layers trace the packed GEMMs
    installed.append("fused_projections")
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except ImportError:
        pass
    else:
        for module in model.modules():
            if isinstance(module, GatedDeltaNet):
                module.rule = fla_delta_rule
        installed.append("fla_prefill")
    if "deltanet_step" in kernels:
        for module in model.modules():
            if isinstance(module, GatedDeltaNet) and "forward" not in vars(module):  # not installed yet
                vars(module)["forward"] = deltanet_decode(module)  # shadows the class's forward
        installed.append("deltanet_step_kernel")
    if "add_rms_norm" in kernels:
        for module in model.modules():
            if isinstance(module, (DecoderLayer, TowerBlock)):
                norm = module.post_attention_layernorm if isinstance(module, DecoderLayer) else module.ffn_norm
                if "add" not in vars(norm):
                    vars(norm)["add"] = norm_kernel(norm)  # shadows RMSNorm.add
        installed.append("add_rms_norm_kernel")
    if "moe_routing" in kernels:
        for module in model.modules():
            if isinstance(module, SparseMoE) and "top_experts" not in vars(module):
                vars(module)["top_experts"] = routing_kernel(module)  # shadows SparseMoE.top_experts
        installed.append("moe_routing_kernel")
    if "prefill_norms" in kernels and not compile_prefill:  # compiled prefill layers fuse their norms
        for module in model.modules():
            if isinstance(module, RMSNorm) and "forward" not in vars(module):
                NormRows(module).install()
            elif isinstance(module, GatedRMSNorm) and "forward" not in vars(module):
                vars(module)["forward"] = gated_norm_rows(module)
            elif (isinstance(module, GatedDeltaNet) and module.rule is fla_delta_rule
                  and "rule_inputs" not in vars(module)):  # bfloat16 q, k, v: what that rule reads
                vars(module)["rule_inputs"] = deltanet_inputs(module)
        installed.append("prefill_norms_kernel")
    if "dense_rows" in kernels:
        install_dense_rows(model)
        installed.append("dense_rows_kernel")
    if "cache_attention" in kernels:
        for module in model.modules():
            if isinstance(module, (GatedAttention, TowerAttention)) and "attend_cache" not in vars(module):
                vars(module)["attend_cache"] = cache_decode(module)  # shadows the class's attend_cache
        installed.append("cache_attention_kernel")
    if "shared_beside" in kernels:
        from engine.drama3.moe_beside import install_beside

        for module in model.modules():
            if isinstance(module, SparseMoE):
                install_beside(module)
        installed.append("shared_beside")
    if compile_layers:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # Module buffers' sizes follow the marks of `caches_symbolic` (the decoder makes them)
        # instead of being static: the caches' slots and rows are symbolic, the rest static.
        torch._dynamo.config.force_parameter_static_shapes = False
        torch._dynamo.config.suppress_errors = True  # a layer that fails to compile runs eagerly
        tower = model.tower
        for layer in (*model.backbone.layers, *tower.shared_layers, *tower.residual_layers):
            layer.forward = layer_compiled(layer.forward, compile_prefill)
        for layer in cast(list[DecoderLayer], list(model.backbone.layers)):  # a mixed step's halves (mixed.py)
            MIXES[layer] = layer_compiled(layer.mix, compile_prefill)
        installed.append("compiled_decode_layers")
        if compile_prefill:
            installed.append("compiled_prefill_layers")
    if model.config.fp8_experts:
        installed.append("fp8_moe")
    return installed

"""The depformer's steps through one function compiled by Inductor: a few fused kernels per step.

    steps = CompiledDepformer(depformer)            # called as Depformer.forward is
    codes = steps(hidden, text, targets, provided, sample, steps=8)

Design choices:
- The steps are sequential by necessity (step t's input is the code drawn from step t - 1's
  logits), so what shrinks is the work inside a step. Eagerly a step of the released
  depformer is ~160 small kernels (each of its 6 layers: the float32 RMSNorm is 6, the
  gated MLP's split and product 3, the key/value writes 2, ...), each a few microseconds
  at batch 1, 8 steps a tick. Here one function computes a whole step (input projection,
  the layers, the logits) and Inductor fuses the norms, residuals, gating and the
  few-position attention into a handful of kernels around the matmuls (cuBLAS).
- One compiled function serves every step: the step's weights are arguments (views of the
  stacked per-step weights, no copies) and the step index is a device tensor, so the
  key/value write is an `index_copy_` and the attention reads every position of the frame
  under a mask (positions past the step still hold the previous frame's values). A
  Python int step would compile once per step.
- The batch becomes dynamic at the second bucket size (Dynamo's automatic dynamic shapes;
  size 1 is its own specialisation), so every bucket of every engine in a process shares
  two or three compiles (`compile_log()` has their seconds). The compile runs at the first
  eager warm-up call of a CUDA graph capture (engine/graphs.py), never inside a capture;
  the compiled code only launches kernels, so the tick's graph captures it.
- The embedding lookup and the draw stay eager (on CUDA the draw is already one kernel).
- It reads and writes the depformer's own key/value buffers, so either path runs on the
  same state. If the compile fails, the eager depformer runs from then on, logged once.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.personaplex.depformer import Depformer, StepLayer
from engine.personaplex.temporal import embed_rows

log = logging.getLogger("retake.personaplex")
Backend = str | Callable[..., Any]  # torch.compile's backend: a name or a compiler function
LayerWeights = tuple[torch.Tensor, ...]  # alpha1, in_proj, out_proj, alpha2, linear_in, linear_out, keys, values
_compiles: list[float] = []  # seconds of each first call that compiled (all engines of this process)
T = TypeVar("T")
_seen: set[tuple[object, ...]] = set()  # (backend, what, batch 1 or 2+, steps, grad): the calls compiled so far


def rms(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """layers.RMSNorm on x [B, 1, D] with weight alpha [1, 1, D]."""
    xf = x.float()
    var = eps + torch.mean(xf * xf, dim=-1, keepdim=True)
    return (xf * (alpha.float() * torch.rsqrt(var))).to(x.dtype)


def step_logits(hidden: torch.Tensor, embedded: torch.Tensor, step: torch.Tensor, w_in: torch.Tensor,
                layers: Sequence[LayerWeights], w_logits: torch.Tensor, num_heads: int, eps: float) -> torch.Tensor:
    """One depformer step: hidden [B, 1, dim], the previous token's embedding [B, 1, D], step [1] (int64)
    -> logits [B, card] (float32); writes the step's keys and values [B, heads, steps, head_dim]."""
    x = F.linear(hidden, w_in) + embedded  # [B, 1, D]
    B, _, D = x.shape
    for alpha1, w_qkv, w_out, alpha2, w_mlp_in, w_mlp_out, keys, values in layers:
        h = rms(x, alpha1, eps)
        q, k, v = F.linear(h, w_qkv).view(B, 3, num_heads, 1, D // num_heads).unbind(1)  # [B, H, 1, Dh]
        keys.index_copy_(2, step, k)
        values.index_copy_(2, step, v)
        seen = torch.arange(keys.shape[2], device=step.device) <= step  # [S]: this frame's steps so far
        scores = q.float() @ keys.float().transpose(-1, -2) / (D // num_heads) ** 0.5  # [B, H, 1, S]
        weights = torch.softmax(torch.where(seen, scores, -torch.inf), dim=-1)
        out = (weights @ values.float()).to(x.dtype)  # [B, H, 1, Dh]
        x = x + F.linear(out.transpose(1, 2).reshape(B, 1, D), w_out)
        g = F.linear(rms(x, alpha2, eps), w_mlp_in)
        g = g.view(B, 1, 2, -1)  # [B, 1, 2, hidden]: gate and up
        x = x + F.linear(F.silu(g[..., 0, :]) * g[..., 1, :], w_mlp_out)
    return F.linear(x, w_logits)[:, 0].float()


@functools.cache
def _compiled(backend: Backend) -> Callable[..., torch.Tensor]:
    """One compiled `step_logits` per backend for the whole process (Dynamo's cache sits on the code)."""
    return cast(Callable[..., torch.Tensor], torch.compile(step_logits, backend=backend))


def compile_log() -> list[float]:
    """Seconds of each call of this process that compiled (the first per batch specialisation), the depformer's
    and Helium's (compiled_temporal.py)."""
    return list(_compiles)


def note_compile(key: tuple[object, ...], started: float, what: str) -> None:
    """After a compiled call begun at `started` (perf_counter): the first of its `key` compiled, so log its time."""
    if key in _seen:
        return
    _seen.add(key)
    _compiles.append(time.perf_counter() - started)
    log.info("compiled %s: batch %s: first call (compile) %.1f s", what, "1" if key[2] == 1 else "2+", _compiles[-1])


class Compiled(Protocol):
    failed: str | None  # why its compile failed (then the eager path runs), or None


def compiled_or_eager(owner: Compiled, what: str, key: tuple[object, ...], compiled: Callable[[], T],
                      eager: Callable[[], T]) -> T:
    """compiled() (its first call per `key` logged as `what`'s compile), or eager() once a compile
    of `owner` has failed: that failure is logged once and kept in `owner.failed`. Inside a CUDA
    graph capture a failure raises (the capture's warm-up call compiled it already)."""
    if owner.failed is None:
        started = time.perf_counter()
        try:
            out = compiled()
        except Exception as error:  # a compile that fails: the eager path from now on
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise
            owner.failed = failure(error)
            log.warning("the compiled %s failed (%s): the eager ones run from now on", what, owner.failed)
        else:
            note_compile(key, started, what)
            return out
    return eager()


def failure(error: BaseException) -> str:
    """What a failed compile raised, unwrapped from Dynamo's exception, in one line."""
    cause = error
    while isinstance(getattr(cause, "inner_exception", None), BaseException):
        cause = cause.inner_exception  # type: ignore[attr-defined]
    return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"


class CompiledDepformer:
    """`Depformer.forward` with each step's maths in one compiled call (`backend`: torch.compile's)."""

    def __init__(self, depformer: Depformer, backend: Backend = "inductor") -> None:
        self.depformer = depformer
        self.backend = backend
        self.failed: str | None = None
        device = depformer.depformer_text_emb.weight.device
        self.step_index = [torch.tensor([t], device=device) for t in range(depformer.steps)]  # [1] each

    def weights(self, t: int, batch: int) -> tuple[torch.Tensor, list[LayerWeights], torch.Tensor]:
        """Step t's input projection, layers (with the first `batch` rows of their key/value buffers), logits."""
        dep = self.depformer
        layers: list[LayerWeights] = []
        for module in dep.depformer.layers:
            layer = cast(StepLayer, module)
            attn = layer.self_attn
            D = attn.in_proj_weight.shape[1]
            mlp = layer.gating[t]
            w_qkv = attn.in_proj_weight.detach().view(attn.steps, 3 * D, D)[t]  # [3D, D]: step t's rows
            w_out = attn.out_proj.weight.detach().view(attn.steps, D, D)[t]
            mlp_in, mlp_out = cast(nn.Linear, mlp.linear_in).weight, cast(nn.Linear, mlp.linear_out).weight
            layers.append((layer.norm1.alpha.detach(), w_qkv, w_out, layer.norm2.alpha.detach(), mlp_in.detach(),
                           mlp_out.detach(), attn.keys[:batch], attn.values[:batch]))
        w_in = cast(nn.Linear, dep.depformer_in[t]).weight.detach()
        return w_in, layers, cast(nn.Linear, dep.linears[t]).weight.detach()

    def logits(self, hidden: torch.Tensor, embedded: torch.Tensor, t: int) -> torch.Tensor:
        """Step t's logits [B, card] (float32), compiled."""
        first = cast(StepLayer, self.depformer.depformer.layers[0])
        w_in, layers, w_logits = self.weights(t, hidden.shape[0])
        args: tuple[Any, ...] = (hidden, embedded, self.step_index[t], w_in, layers, w_logits,
                                 first.self_attn.num_heads, first.norm1.eps)
        if hidden.shape[0] > 1:  # one compile for every batch of 2 or more (1 is Dynamo's own case)
            for tensor in (hidden, embedded, *(t for layer in layers for t in layer[-2:])):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        key = (self.backend, "depformer", min(hidden.shape[0], 2), first.self_attn.steps, torch.is_grad_enabled())
        started = time.perf_counter()
        out = _compiled(self.backend)(*args)
        note_compile(key, started, "depformer")
        return out

    def __call__(self, hidden: torch.Tensor, text: torch.Tensor, targets: torch.Tensor, provided: torch.Tensor,
                 sample: Callable[[torch.Tensor, int], torch.Tensor], steps: int | None = None) -> torch.Tensor:
        """As `Depformer.forward`: hidden [B, 1, D], text [B], targets/provided [B, all steps] -> codes [B, steps]."""
        dep = self.depformer
        if self.failed is not None:
            eager: torch.Tensor = dep(hidden, text, targets, provided, sample, steps)
            return eager
        codes = []
        previous = text
        for t in range(dep.steps if steps is None else steps):
            table = dep.depformer_text_emb.weight if t == 0 else cast(nn.Embedding, dep.depformer_emb[t - 1]).weight
            embedded = embed_rows(table, previous)[:, None]  # [B, 1, D]
            try:
                logits = self.logits(hidden, embedded, t)
            except Exception as error:  # a compile that fails here: the eager steps, from step 0
                if hidden.is_cuda and torch.cuda.is_current_stream_capturing():
                    raise
                self.failed = failure(error)
                log.warning("the compiled depformer failed (%s): the eager depformer runs from now on", self.failed)
                eager = dep(hidden, text, targets, provided, sample, steps)
                return eager
            token = sample(logits, t)
            codes.append(token)
            previous = torch.where(provided[:, t], targets[:, t], token)
        return torch.stack(codes, dim=1)

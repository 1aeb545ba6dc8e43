"""Streaming attention over a per-slot ring of past keys and values (Moshi's `RingKVCache`).

    step = ring_step(positions, capacity, context, head_dim, max_period, rows)  # once per forward
    out = attention(x, step)                                                   # every layer

Design choices:
- A static ring of `capacity` keys and values per slot, allocated when its streams are set
  up (streaming.py). The caller passes each row's absolute positions; the ring slot of
  position p is p % capacity, and the position a slot holds is recomputed from the row's
  last position. A key is visible when 0 <= q - p < context and p >= 0, as in Moshi, so a
  conversation runs past the ring's length by overwriting its oldest key: a call of any
  length, at the cost of one context.
- Keys of a chunk are written before any query reads, so with T > 1 (Mimi writes 2
  positions a frame) the first query of a chunk already misses the oldest slot, exactly as
  Moshi does once the ring has wrapped.
- A row's history is forgotten by giving it negative positions: nothing below 0 is ever
  visible, so restarting a row's stream needs nothing from the ring (but its NaN: see
  `clear_on_reset`). The one exception is
  a query's own key, always visible, so a row at position -1 attends to itself.
- `rows` (a slice of the slots) says which slots a call runs: a prefix for a tick of a
  batch bucket, one slot for its system prompt. A slice keeps every state tensor a view
  at a fixed address, so each bucket can be captured as a CUDA graph.
- The ring may hold float8 (e4m3) keys and values with one float32 scale per (slot, head,
  position), amax / 448 (`kv_dtype`, set before the streams): half the bytes of bfloat16,
  so 128 conversations of full context fit on one H200 (docs/perf.md). Written through a
  uint8 view (scatter has no float8 kernel); read back by the fused kernel directly, or
  dequantised for the torch path.
- On CUDA a tick's write (one position per row) is one launch (engine/kernels/ring_store.py)
  instead of four scatters, and one query per row goes to the fused decode kernel
  (engine/kernels/ring_attention.py: reads float8 or bfloat16, computes the visibility
  from the position, skips the ring slots a young conversation has not written) when
  `fused` is set; everything else, and every CPU call, is the torch path below, which is
  the kernel's reference. The kernel skips the rows a tick holds (`active`): their output
  is never kept, and the torch path computes them all. A kernel that fails to build on the
  GPU gives way to its reference, logged once (engine/kernels/fallback.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.personaplex.layers import apply_rope, rope_tables
from engine.personaplex.streaming import StreamingModule

log = logging.getLogger("retake.personaplex")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def ring_mask(positions: torch.Tensor, capacity: int, context: int) -> torch.Tensor:
    """Which ring slots each query sees: bool [B, 1, T, capacity] for positions [B, T]."""
    last = positions[:, -1:]  # [B, 1]
    slots = torch.arange(capacity, device=positions.device)
    held = last - torch.remainder(last - slots, capacity)  # [B, capacity]: the position each slot holds
    q = positions[:, :, None]  # [B, T, 1]
    p = held[:, None, :]  # [B, 1, capacity]
    visible = (p >= 0) & (p <= q) & (q - p < context)
    return (visible | (p == q))[:, None]


@dataclass
class RingStep:
    """What every attention layer needs for one call, computed once per forward (`ring_step`)."""

    rows: slice  # the slots this call runs
    positions: torch.Tensor  # [B, T] absolute positions
    slots: torch.Tensor  # [B, T] ring slot of each new position
    mask: torch.Tensor  # [B, 1, T, capacity]
    cos: torch.Tensor  # [B, 1, T, head_dim / 2]
    sin: torch.Tensor
    context: int
    active: torch.Tensor | None = None  # [B] bool: the rows whose output is kept (None: all)


def ring_step(positions: torch.Tensor, capacity: int, context: int, head_dim: int, max_period: float,
              rows: slice | None = None, active: torch.Tensor | None = None) -> RingStep:
    cos, sin = rope_tables(positions, head_dim, max_period)
    rows = slice(0, positions.shape[0]) if rows is None else rows
    return RingStep(rows, positions, torch.remainder(positions, capacity), ring_mask(positions, capacity, context),
                    cos, sin, context, active)


DEQUANTIZE_VALUES = 1 << 25  # float8 values dequantised at once (128 MiB of float32): a released-size row is 12.3M


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, H, T, Dh] -> float8 [B, H, T, Dh] and float32 scales [B, H, T] (amax / 448 per vector)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX  # [B, H, T]
    return (xf / scale[..., None]).to(FP8), scale


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8 [B, H, C, Dh] with scales [B, H, C] -> dtype [B, H, C, Dh], DEQUANTIZE_VALUES at a time:
    the float32 product of 16 released-size rows at once asked for 0.75 GiB beside the engine's
    state (the H100's out-of-memory at 64 slots, stop 37); row by row it is the same arithmetic."""
    rows = max(1, DEQUANTIZE_VALUES // max(1, x[0].numel())) if x.shape[0] else 1
    if x.shape[0] <= rows:
        return (x.float() * scale[..., None]).to(dtype)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    for first in range(0, x.shape[0], rows):
        out[first:first + rows] = (x[first:first + rows].float() * scale[first:first + rows, ..., None]).to(dtype)
    return out


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     guard: bool = True) -> torch.Tensor:
    """Queries [B, H, T, Dh] over a ring's keys and values [B, H, C, Dh] under `ring_mask`'s mask
    [B, 1, T, C] -> [B, H, T, Dh]: the torch path (compiled_mimi.py compiles it too)."""
    # A masked slot still enters attention's sums (its score plus -inf, its value times 0), and
    # NaN stays NaN: what a conversation that went non-finite left in its ring must not reach
    # the next one in its slot. `guard` keeps the hidden slots out; a ring cleared at each reset
    # (`clear_on_reset`) has nothing of another conversation to keep out.
    if guard:
        seen = mask.any(dim=2)[..., None]  # [B, 1, C, 1]: slots some query of the call sees
        keys, values = torch.where(seen, keys, 0), torch.where(seen, values, 0)  # [B, H, C, Dh]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [B, H, T, Dh]


@functools.cache
def _fused_kernel() -> Callable[..., torch.Tensor] | None:
    """The fused decode attention (falling back to its reference if it fails on this GPU), or None
    (no Triton): imported on first use."""
    try:
        from engine.kernels.fallback import guarded
        from engine.kernels.ring_attention import ring_attention_kernel, ring_attention_reference
    except ImportError as error:  # a CUDA torch without Triton: the torch path, said once
        log.warning("fused ring attention unavailable (%s): using the torch path", error)
        return None
    return functools.partial(guarded, "ring attention", ring_attention_kernel, ring_attention_reference)


@functools.cache
def _fused_store() -> Callable[..., None] | None:
    """A tick's ring write in one launch (falling back to the scatters if it fails on this GPU), or
    None (no Triton)."""
    try:
        from engine.kernels.fallback import guarded
        from engine.kernels.ring_store import ring_store_kernel, ring_store_reference
    except ImportError:  # said once by _fused_kernel
        return None
    return functools.partial(guarded, "ring store", ring_store_kernel, ring_store_reference)


class RingAttention(StreamingModule):
    """Causal self-attention over a per-slot ring of `capacity` past positions, with RoPE."""

    keys: torch.Tensor  # [B, heads, capacity, head_dim] in kv_dtype
    values: torch.Tensor
    key_scales: torch.Tensor  # [B, heads, capacity] float32 with a float8 ring, else empty
    value_scales: torch.Tensor

    def __init__(self, dim: int, num_heads: int, capacity: int, clear_on_reset: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.capacity = capacity
        # Zero a restarted row's ring (so attention needs no guard against what its previous
        # conversation left): Mimi's rings (250 positions of 512, ~1 MiB a row a layer). Helium's
        # (3,000 of 4,096) would be a pass over every slot's ring at each reset, ~50 GB at 64
        # conversations: they keep the guard (and the fused kernel reads only what a row wrote).
        self.clear_on_reset = clear_on_reset
        self.kv_dtype: torch.dtype | None = None  # None: the weights' dtype (set before setup_streams)
        self.fused = False  # the fused decode kernel for one query per row on CUDA
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)
        for name in ("keys", "values", "key_scales", "value_scales"):
            self.register_buffer(name, torch.zeros(0), persistent=False)

    @property
    def float8(self) -> bool:
        return self.keys.dtype == FP8

    def _setup_stream(self, batch: int) -> None:
        dim = self.out_proj.weight.shape[0]
        w = self.in_proj_weight
        shape = (batch, self.num_heads, self.capacity, dim // self.num_heads)
        dtype = self.kv_dtype or w.dtype
        self.keys = torch.zeros(shape, dtype=dtype, device=w.device)
        self.values = torch.zeros(shape, dtype=dtype, device=w.device)
        scales = shape[:3] if dtype == FP8 else (0,)
        self.key_scales = torch.zeros(scales, dtype=torch.float32, device=w.device)
        self.value_scales = torch.zeros(scales, dtype=torch.float32, device=w.device)

    def _reset_stream(self, rows: torch.Tensor) -> None:
        if self.clear_on_reset:
            for state in (self.keys, self.values, self.key_scales, self.value_scales):
                if state.numel():
                    state.masked_fill_(rows.view(-1, *([1] * (state.dim() - 1))), 0)

    def stream_bytes(self) -> int:
        """Bytes of ring state per slot."""
        return sum(t.nbytes for t in (self.keys, self.values, self.key_scales, self.value_scales)) // max(
            1, self.keys.shape[0])

    def stored(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Keys or values [B, H, T, Dh] as the ring holds them: float8 with scales [B, H, T], or its dtype."""
        if not self.float8:
            return x.to(self.keys.dtype), None
        return quantize_kv(x)

    def store(self, k: torch.Tensor, key_scale: torch.Tensor | None, v: torch.Tensor, value_scale: torch.Tensor | None,
              step: RingStep) -> None:
        """Put this call's stored keys and values [B, H, T, Dh] (and scales) in their ring slots."""
        rows = step.rows
        store = _fused_store() if self.fused and k.shape[2] == 1 and k.is_cuda else None
        if store is not None:  # a tick: one launch for keys, values and scales
            float8 = self.float8
            store(self.keys[rows], self.values[rows], self.key_scales[rows] if float8 else None,
                  self.value_scales[rows] if float8 else None, k[:, :, 0], v[:, :, 0],
                  key_scale[:, :, 0] if key_scale is not None else None,
                  value_scale[:, :, 0] if value_scale is not None else None, step.slots[:, 0])
            return
        index = step.slots[:, None, :, None].expand_as(k)  # [B, H, T, Dh]
        if not self.float8:
            self.keys[rows].scatter_(2, index, k)
            self.values[rows].scatter_(2, index, v)
            return
        assert key_scale is not None and value_scale is not None
        where = step.slots[:, None, :].expand(k.shape[:3])  # [B, H, T]
        for ring, scales, x, scale in ((self.keys, self.key_scales, k, key_scale),
                                       (self.values, self.value_scales, v, value_scale)):
            ring[rows].view(torch.uint8).scatter_(2, index, x.view(torch.uint8))  # scatter has no float8 kernel
            scales[rows].scatter_(2, where, scale)

    def attend(self, q: torch.Tensor, step: RingStep) -> torch.Tensor:
        """Queries [B, H, T, Dh] over the ring (this call's keys already stored) -> [B, H, T, Dh]."""
        kernel = _fused_kernel() if self.fused and q.shape[2] == 1 and q.is_cuda else None
        if kernel is not None:
            rows = step.rows
            scales = (self.key_scales[rows], self.value_scales[rows]) if self.float8 else (None, None)
            out: torch.Tensor = kernel(q[:, :, 0], self.keys[rows], self.values[rows], *scales, step.positions[:, 0],
                                       step.context, step.active)[:, :, None]  # [B, H, 1, Dh]
            return out
        keys, values = self._read(step.rows, q.dtype)
        return masked_attention(q, keys, values, step.mask, guard=not self.clear_on_reset)

    def _read(self, rows: slice, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.float8:
            return self.keys[rows].to(dtype), self.values[rows].to(dtype)
        return (dequantize_kv(self.keys[rows], self.key_scales[rows], dtype),
                dequantize_kv(self.values[rows], self.value_scales[rows], dtype))

    def forward(self, x: torch.Tensor, step: RingStep) -> torch.Tensor:
        B, T, D = x.shape
        qkv = F.linear(x, self.in_proj_weight).view(B, T, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, Dh]
        q, k = apply_rope(q, step.cos, step.sin), apply_rope(k, step.cos, step.sin)
        self.store(*self.stored(k), *self.stored(v), step)
        out = self.attend(q, step)
        result: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(B, T, D))
        return result

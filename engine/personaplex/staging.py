"""The staging ring of tokens: where each slot's streams wait out their delays (PP-lm `LMGen`).

Token rows (K = 17): text, agent codebooks 0..7, user codebooks 0..7, each with a delay
(text 0, codebook 0 0, codebooks 1..7 1). A slot's state is `ring` [K, CT = max_delay + 3]
of tokens, `provided` [K, CT] (a value was written from outside and must not be replaced
by a sample) and its local step `local` (ticks since its stream started). At local step L:

1. `write`: values written from outside (the user's codes; during a system prompt also
   the forced text and agent tokens) go to column (L + delay) % CT, marked provided.
2. `gate`: rows whose delay is >= L get their initial token (text: text_card, audio:
   card) at column L % CT, marked provided (the warm-up).
3. `read`: the model input is column (L - 1) % CT, at position L - 1; the target column is
   L % CT with its provided marks.
4. `commit`: column (L - 1) % CT stops being provided; the samples go to column L % CT
   where nothing was provided.
5. `frame`: from L > max_delay, the de-delayed frame is token k of column
   (L - max_delay + delay_k) % CT.

Design choices:
- Every slot has its own step (`local`), so a slot's stream is exactly a fresh
  single-slot stream (the reference's offset), whatever the other slots do: no shared
  physical offset, no phase to roll a voice cache by. Local step 0 is the stream's first
  tick (the reference's cold start): its model input is all initial tokens at position
  -1, a key no later tick sees (ring.py), and its samples are all overwritten by the gate.
- Functions over tensors with a leading row dimension, the same on the GPU (a tick's
  rows, inside a CUDA graph: gathers and scatters, no host sync) and on the CPU (a system
  prompt planned row by row, prompt.py). `active` rows change; the others keep their
  state untouched, so a slot can wait while its system prompt is read.
"""

from __future__ import annotations

import torch


def _columns(local: torch.Tensor, shift: torch.Tensor | int, rows: int, ct: int) -> torch.Tensor:
    """int64 [B, K, 1]: column (local + shift) % CT of every row k (shift [K] or an int)."""
    return torch.remainder(local[:, None] + shift, ct).expand(-1, rows)[..., None]


def _put(ring: torch.Tensor, columns: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
    """ring[b, k, columns[b, k]] = values[b, k] where `where` [B, K]."""
    old = ring.gather(2, columns)[..., 0]
    ring.scatter_(2, columns, torch.where(where, values, old)[..., None])


def write(ring: torch.Tensor, provided: torch.Tensor, local: torch.Tensor, delays: torch.Tensor,
          values: torch.Tensor, where: torch.Tensor) -> None:
    """Step 1: values [B, K] where `where` [B, K] go to column (local + delay) % CT, provided."""
    columns = _columns(local, delays, ring.shape[1], ring.shape[2])
    _put(ring, columns, values, where)
    _put(provided, columns, torch.ones_like(where), where)


def gate(ring: torch.Tensor, provided: torch.Tensor, local: torch.Tensor, delays: torch.Tensor,
         initial: torch.Tensor, active: torch.Tensor) -> None:
    """Step 2: rows in warm-up (local <= delay) of active slots hold their initial token at local % CT."""
    warm = (local[:, None] <= delays) & active[:, None]  # [B, K]
    columns = _columns(local, 0, ring.shape[1], ring.shape[2])
    _put(ring, columns, initial.expand_as(warm), warm)
    _put(provided, columns, warm, warm)


def read(ring: torch.Tensor, provided: torch.Tensor,
         local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 3: (model input [B, K], target [B, K], target provided [B, K])."""
    K, ct = ring.shape[1], ring.shape[2]
    source, target = _columns(local, -1, K, ct), _columns(local, 0, K, ct)
    return ring.gather(2, source)[..., 0], ring.gather(2, target)[..., 0], provided.gather(2, target)[..., 0]


def commit(ring: torch.Tensor, provided: torch.Tensor, local: torch.Tensor, sampled: torch.Tensor,
           active: torch.Tensor) -> None:
    """Step 4 for the active slots: samples [B, K] where the target was not provided; the source column
    stops being provided; the slots advance one step."""
    K, ct = ring.shape[1], ring.shape[2]
    source, target = _columns(local, -1, K, ct), _columns(local, 0, K, ct)
    rows = active[:, None].expand(-1, K)  # [B, K]
    _put(ring, target, sampled, rows & ~provided.gather(2, target)[..., 0])
    _put(provided, source, torch.zeros_like(rows), rows)
    local += active.long()


def frame(ring: torch.Tensor, local: torch.Tensor, delays: torch.Tensor, max_delay: int) -> torch.Tensor:
    """Step 5: the de-delayed frame [B, K] of step local - 1 (valid once local - 1 > max_delay)."""
    columns = _columns(local, delays - (max_delay + 1), ring.shape[1], ring.shape[2])
    return ring.gather(2, columns)[..., 0]

"""What a PersonaPlex conversation costs in memory, and whether the slots asked for fit.

Design choices:
- A slot's state is Helium's key/value rings (their dtype as configured: float8 with a
  float32 scale per head vector on CUDA) and Mimi's streams (its transformers' rings,
  float32); the weights are shared. `slot_bytes` counts it from the config (before any
  allocation), `stream_bytes` from the buffers (after).
- The slots must fit in the GPU's free memory with 10% to spare (activations, graphs):
  else a RequestError says how many fit, rather than an out-of-memory error mid-setup.
  `shortfall` is that sum and its sentence, for the engine and for the bench (which skips
  a slot count that does not fit and times the others).
"""

from __future__ import annotations

import torch

from engine.errors import RequestError
from engine.personaplex.config import PersonaPlexConfig
from engine.personaplex.ring import FP8
from engine.personaplex.streaming import StreamingModule
from engine.personaplex.temporal import Temporal


def stream_bytes(module: torch.nn.Module) -> float:
    """Bytes of per-slot streaming state in `module`'s tree, per slot."""
    total, slots = 0, 1
    for child in module.modules():
        if isinstance(child, StreamingModule):
            for name in child._non_persistent_buffers_set:
                buffer = getattr(child, name)
                if buffer.dim():
                    total, slots = total + buffer.nbytes, max(slots, buffer.shape[0])
    return total / slots


def slot_bytes(cfg: PersonaPlexConfig, temporal: Temporal) -> int:
    """Bytes of state one slot needs: Helium's key/value rings (as configured) and Mimi's streams."""
    lm, mimi = cfg.lm, cfg.mimi
    ring = temporal.rings()[0]
    dtype = ring.kv_dtype or ring.in_proj_weight.dtype
    kv = lm.num_layers * 2 * lm.context * lm.dim * dtype.itemsize
    if dtype == FP8:
        kv += lm.num_layers * 2 * lm.context * lm.num_heads * 4  # float32 scales
    codec = 2 * mimi.num_layers * 2 * mimi.context * mimi.d_model * 4  # encoder and decoder rings, float32
    return kv + codec


def shortfall(cfg: PersonaPlexConfig, temporal: Temporal, slots: int, free: float, spare: int = 0) -> str | None:
    """None where the slots' state (and `spare` rows of it: the prompt reader's scratch row) fits in
    `free` bytes with 10% to spare (activations, graphs); else what it needs and how many slots fit."""
    per_slot = slot_bytes(cfg, temporal)
    fit = int(free / 1.1 // per_slot) - spare
    if slots <= fit:
        return None
    return (f"{slots} PersonaPlex slots need {(slots + spare) * per_slot / 2**30:.1f} GiB of state "
            f"({per_slot / 2**30:.2f} GiB each), but {free / 2**30:.1f} GiB of the GPU are free: "
            f"use at most {fit} slots")


def check_memory(cfg: PersonaPlexConfig, temporal: Temporal, slots: int, device: torch.device, spare: int = 0) -> None:
    """On a GPU: the slots' state must fit in free memory (`shortfall`), or a RequestError says how many
    slots fit, rather than an out-of-memory error mid-setup."""
    if device.type != "cuda":
        return
    reason = shortfall(cfg, temporal, slots, free_bytes(device), spare)
    if reason is not None:
        raise RequestError(reason)


def free_bytes(device: torch.device) -> int:
    """The GPU memory this process can still take: the driver's free memory and what PyTorch's
    allocator holds unused (building the released size's random weights left ~10 GiB there, and
    the stop-41 H100 server refused 128 slots on 51.8 GiB "free")."""
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(torch.cuda.mem_get_info(device)[0] + cached)

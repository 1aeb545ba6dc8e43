"""What a take that went non-finite leaves in its slot: NaN in every cache row and DeltaNet state
(the CPU and GPU tests of a take started after one)."""

from __future__ import annotations

import math

import torch

from engine.drama3.deltanet import GatedDeltaNet
from engine.drama3.layers import KVCache


def poison(model: torch.nn.Module, slot: int) -> None:
    with torch.inference_mode():
        for module in model.modules():
            if isinstance(module, KVCache):
                module.k[slot], module.v[slot] = math.nan, math.nan
            if isinstance(module, GatedDeltaNet):
                module.recurrent_state[slot], module.conv_state[slot] = math.nan, math.nan

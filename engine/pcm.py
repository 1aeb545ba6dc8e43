"""PCM16: the one conversion of float audio to 16-bit samples, for both engines.

Design choices:
- `round(clip(x, -1, 1) * 32767)`: clipped so a loud sample saturates instead of
  wrapping, rounded (half to even, as torch and numpy both round) so the error is at
  most half a step and symmetric around zero. -1.0 maps to -32767, never -32768.
- One function for torch tensors (Drama 3 converts on the codec's device, so only int16
  crosses to the host) and numpy arrays (PersonaPlex frames on the host), the same rule
  (tests/engine/test_pcm.py pins it and checks the two agree).
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import torch
from numpy.typing import NDArray

PCM16_MAX = 32767.0


@overload
def pcm16(audio: torch.Tensor) -> torch.Tensor: ...


@overload
def pcm16(audio: NDArray[np.floating[Any]]) -> NDArray[np.int16]: ...


def pcm16(audio: torch.Tensor | NDArray[np.floating[Any]]) -> torch.Tensor | NDArray[np.int16]:
    """float audio (nominally in [-1, 1]) -> int16 samples, on the same device or as an array."""
    if isinstance(audio, torch.Tensor):
        return (audio.clamp(-1.0, 1.0) * PCM16_MAX).round().to(torch.int16)
    samples: NDArray[np.int16] = np.round(np.clip(audio, -1.0, 1.0) * PCM16_MAX).astype(np.int16)
    return samples

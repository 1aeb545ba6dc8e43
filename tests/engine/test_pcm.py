"""PCM16 conversion: one rule for both engines, rounding with clipping, the same for torch and numpy."""

from __future__ import annotations

import numpy as np
import torch

from engine.pcm import pcm16

STEP = 1 / 32767


def test_pcm16_rounds_to_the_nearest_step_and_clips() -> None:
    audio = np.array([0.0, 0.4 * STEP, 0.6 * STEP, -0.6 * STEP, 1.4 * STEP, 1.6 * STEP, 0.5, -0.5,
                      1.0, -1.0, 1.5, -7.0], dtype=np.float32)
    expected = np.array([0, 0, 1, -1, 1, 2, 16384, -16384, 32767, -32767, 32767, -32767], dtype=np.int16)
    out = pcm16(audio)
    assert out.dtype == np.int16
    np.testing.assert_array_equal(out, expected)


def test_pcm16_is_the_same_for_torch_and_numpy() -> None:
    audio = torch.linspace(-1.2, 1.2, 100_001)  # float32, many values between steps
    from_torch = pcm16(audio)
    assert from_torch.dtype == torch.int16
    np.testing.assert_array_equal(from_torch.numpy(), pcm16(audio.numpy()))
    # Rounding, not truncation: the error is at most half a step inside [-1, 1].
    inside = audio.abs() <= 1
    error = (from_torch.float() - audio * 32767)[inside].abs().max().item()
    assert error <= 0.5 + 1e-3

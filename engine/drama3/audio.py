"""Reference clips in: WAV/FLAC (bytes, base64 text or a path) to mono float32 at the codec rate.

Design choices:
- soundfile reads the container; anything it cannot read is "not audio". Channels are
  averaged (downmix), other rates resampled with soxr's HQ filter (librosa's default,
  as the seed).
- The limits are the seed's: at most 60 s, at least one codec frame. Every refusal is a
  RequestError whose message says what to send instead.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from engine.errors import RequestError

SAMPLE_RATE = 44100
FRAME_SAMPLES = 2048
MAX_REFERENCE_SECONDS = 60.0


def reference_bytes(data: bytes | str | os.PathLike[str]) -> bytes:
    """The clip's file bytes: bytes as given, str as base64, a path's contents."""
    if isinstance(data, os.PathLike):
        try:
            return Path(data).read_bytes()
        except OSError as error:
            raise RequestError(f"cannot read reference audio file {data}: {error.strerror}") from error
    if isinstance(data, str):
        try:
            return base64.b64decode(data.strip(), validate=True)
        except (binascii.Error, ValueError) as error:
            raise RequestError("reference audio is not valid base64; send the WAV or FLAC file "
                               "base64-encoded") from error
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise RequestError(f"reference audio must be WAV/FLAC bytes or base64 text; got {type(data).__name__}")


def read_reference_audio(data: bytes | str | os.PathLike[str], sample_rate: int = SAMPLE_RATE,
                         frame_samples: int = FRAME_SAMPLES) -> NDArray[np.float32]:
    """Mono float32 samples [S] at `sample_rate`, in [-1, 1], one frame to 60 s long."""
    import soundfile as sf

    content = reference_bytes(data)
    if not content:
        raise RequestError("reference audio is empty; send a WAV or FLAC clip of speech")
    try:
        samples, rate = sf.read(io.BytesIO(content), dtype="float32", always_2d=True)  # [S, channels]
    except Exception as error:
        # libsndfile's reason, without soundfile's "Error opening <_io.BytesIO object at 0x...>: "
        why = str(error).rpartition(">: ")[2] or type(error).__name__
        raise RequestError(f"reference audio is not a readable WAV or FLAC file ({why}); "
                           "send a WAV or FLAC clip") from error
    if samples.size == 0:
        raise RequestError("reference audio holds no samples; send a clip of speech")
    seconds = samples.shape[0] / rate
    if seconds > MAX_REFERENCE_SECONDS:
        raise RequestError(f"reference audio is {seconds:.1f} s long; the limit is "
                           f"{MAX_REFERENCE_SECONDS:g} s, send a shorter clip")
    samples = samples.mean(axis=1)
    if not np.isfinite(samples).all():
        raise RequestError("reference audio holds NaN or infinite samples")
    if rate != sample_rate:
        import librosa

        samples = librosa.resample(samples, orig_sr=rate, target_sr=sample_rate, res_type="soxr_hq")
    if samples.size < frame_samples:
        raise RequestError(f"reference audio is {samples.size / sample_rate * 1000:.0f} ms long; send at "
                           f"least {frame_samples / sample_rate * 1000:.0f} ms (one codec frame)")
    return np.ascontiguousarray(np.clip(samples, -1.0, 1.0), dtype=np.float32)

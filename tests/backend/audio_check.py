"""Decoding and comparing encoded audio for the tests: what a client does with a response's bytes."""

from __future__ import annotations

import io

import av
import librosa
import numpy as np

MAX_LAG = 4096  # samples: encoder delay a decoder does not trim (an MP3 without a LAME header, ADTS AAC)

# What each lossy codec keeps of the demo's audio (noise from random weights, which perceptual
# codecs keep worst): the waveform's correlation after aligning the codec's delay, and the
# spectral envelope (32 mel bands, dB). Measured on the demo's takes: mp3 0.89 / 0.46 dB, opus
# 0.73 / 0.47 dB, aac 0.97 / 0.63 dB (tests/backend/test_audio_formats.py prints them).
LOSSY = {"mp3": (0.8, 1.5), "opus": (0.6, 1.5), "aac": (0.9, 1.5)}


def decode(data: bytes, sample_rate: int) -> np.ndarray:
    """float32 [N] mono at `sample_rate`, decoded by FFmpeg (PyAV) whatever the container."""
    pieces = []
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        for frame in container.decode(container.streams.audio[0]):
            pieces += [f.to_ndarray()[0] for f in resampler.resample(frame)]
        pieces += [f.to_ndarray()[0] for f in resampler.resample(None)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def aligned(decoded: np.ndarray, reference: np.ndarray) -> tuple[int, np.ndarray]:
    """The codec's delay (0..MAX_LAG samples) and the decoded samples from there, as long as the reference."""
    n = len(reference)
    scores = [float(np.dot(decoded[lag:lag + n], reference[:len(decoded[lag:lag + n])]))
              for lag in range(min(MAX_LAG, max(1, len(decoded) - n + 1)))]
    lag = int(np.argmax(scores))
    return lag, decoded[lag:lag + n]


def envelope_db(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    mel = librosa.feature.melspectrogram(y=samples, sr=sample_rate, n_fft=2048, hop_length=512, n_mels=32,
                                         fmax=16000)  # [32, frames]
    return 10 * np.log10(mel + 1e-10)


def likeness(decoded: np.ndarray, reference: np.ndarray, sample_rate: int) -> tuple[int, float, float]:
    """(delay, waveform correlation, mean |envelope difference| in dB) of a decoding against the take."""
    lag, part = aligned(decoded, reference)
    assert len(part) == len(reference), f"decoded {len(decoded)} samples for a take of {len(reference)}"
    correlation = float(np.corrcoef(part, reference)[0, 1])
    difference = float(np.mean(np.abs(envelope_db(part, sample_rate) - envelope_db(reference, sample_rate))))
    return lag, correlation, difference


PCM_RATE = 24_000  # OpenAI's raw PCM


def assert_like(name: str, data: bytes, take: np.ndarray, sample_rate: int) -> None:
    """`data` (a file of format `name`) holds the take (int16 [N]) within the codec's tolerance;
    `pcm` is the take at 24 kHz, compared with another resampler's (soxr, through librosa)."""
    reference = take.astype(np.float32) / 32768
    if name == "pcm":
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
        expected = librosa.resample(reference, orig_sr=sample_rate, target_sr=PCM_RATE)
        assert abs(len(samples) - len(expected)) <= 2, f"pcm: {len(samples)} samples at 24 kHz, not {len(expected)}"
        n = min(len(samples), len(expected))
        if n:
            correlation = float(np.corrcoef(samples[:n], expected[:n])[0, 1])
            assert correlation >= 0.99, f"pcm: correlation {correlation:.4f} with the take resampled by soxr"
        return
    decoded = decode(data, sample_rate)
    if name not in LOSSY:  # wav, flac: the samples themselves
        np.testing.assert_array_equal(np.round(decoded * 32768).astype(np.int16), take)
        return
    lag, correlation, difference = likeness(decoded, reference, sample_rate)
    least, most = LOSSY[name]
    assert correlation >= least and difference <= most, (
        f"{name}: correlation {correlation:.3f} (>= {least}), envelope {difference:.2f} dB (<= {most}), delay {lag}")

"""backend/audio_formats.py: every response format, whole and streamed, decoded back by FFmpeg and libsndfile."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from audio_check import assert_like, decode, likeness

from backend.audio_formats import FORMATS, Encoder, encode

RATE = 44100
WINDOWS = [4, 10, 12, 32, 64, 64]  # frames of 2048 samples: the engine's streaming schedule


def tones() -> np.ndarray:
    """Two seconds of a glide and a tone: what perceptual codecs keep well (int16 [88200])."""
    t = np.arange(2 * RATE) / RATE
    return np.round((0.3 * np.sin(2 * np.pi * 220 * t * (1 + t)) + 0.2 * np.sin(2 * np.pi * 1000 * t))
                    * 32767).astype(np.int16)


def noise(frames: int) -> np.ndarray:
    """Shaped noise like the demo's (its weights are random), int16 [frames * 2048]."""
    rng = np.random.default_rng(0)
    white = rng.standard_normal(frames * 2048 + 64)
    return np.round(np.convolve(white, np.hanning(64) / 8, "valid")[:frames * 2048] * 8000).astype(np.int16)


def streamed(name: str, take: np.ndarray) -> list[bytes]:
    """The chunks a streamed response sends: one per engine window, then the encoder's tail."""
    encoder = Encoder(name, RATE, streamed=True)
    chunks, start = [], 0
    for frames in WINDOWS:
        chunks.append(encoder.write(take[start:start + frames * 2048]))
        start += frames * 2048
    return [*chunks, encoder.close()]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_whole_and_streamed_decode_to_the_take(name: str) -> None:
    take = noise(sum(WINDOWS))
    assert_like(name, encode(name, take, RATE), take, RATE)
    chunks = streamed(name, take)
    assert_like(name, b"".join(chunks), take, RATE)
    # Streaming: the first window's audio leaves before the take is over, and so does most of it.
    assert len(chunks[0]) > 0, "the first window gave no bytes"
    assert sum(map(len, chunks[:-1])) > 0.8 * sum(map(len, chunks))


@pytest.mark.parametrize(("name", "snr_db"), [("mp3", 20), ("opus", 30), ("aac", 25)])
def test_lossy_codecs_keep_tones(name: str, snr_db: float) -> None:
    take = tones()
    reference = take.astype(np.float32) / 32768
    _, correlation, _ = likeness(decode(encode(name, take, RATE), RATE), reference, RATE)
    # SNR after aligning the codec's delay: measured mp3 26 dB, opus 42 dB, aac 31 dB.
    assert 10 * np.log10(1 / (1 / correlation**2 - 1)) >= snr_db


@pytest.mark.parametrize("name", ["wav", "flac", "mp3", "opus"])
def test_whole_files_read_with_libsndfile(name: str) -> None:
    """A whole file has complete headers: libsndfile (another decoder than FFmpeg) reads its length."""
    take = noise(8)
    samples, rate = sf.read(io.BytesIO(encode(name, take, RATE)), dtype="int16")
    assert (rate, len(samples)) == ((48000, round(len(take) * 48000 / RATE)) if name == "opus" else (RATE, len(take)))
    if name in ("wav", "flac"):
        np.testing.assert_array_equal(samples, take)


def test_a_take_without_audio_is_an_empty_file() -> None:
    """(MP3, ADTS and Ogg Opus have no way to say "no audio" that FFmpeg can probe.)"""
    assert encode("pcm", np.zeros(0, np.int16), RATE) == b""
    for name in ("wav", "flac"):
        assert len(decode(encode(name, np.zeros(0, np.int16), RATE), RATE)) == 0

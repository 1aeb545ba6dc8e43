"""Voice prompt plumbing: loudness normalisation, frames, bundles on disk, system tags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.checkpoint import voices_dir
from engine.personaplex.prompt import Voice, persona_tokens, wrap_with_system_tags
from engine.personaplex.voices import (
    find_voice,
    frames_of,
    integrated_loudness,
    list_voices,
    load_bundle,
    normalize_loudness,
    read_audio,
    save_voice_bundle,
)


@pytest.mark.parametrize("rate", [24000, 48000])
def test_loudness_of_a_full_scale_1khz_sine_is_minus_3_lufs(rate: int):
    # ITU-R BS.1770 calibration: a 0 dBFS 1 kHz sine reads -3.01 LKFS (K-weighting is ~0 dB at 1 kHz).
    t = np.arange(3 * rate) / rate
    sine = np.sin(2 * np.pi * 1000 * t)
    assert integrated_loudness(sine, rate) == pytest.approx(-3.01, abs=0.1)
    assert integrated_loudness(0.1 * sine, rate) == pytest.approx(-23.01, abs=0.1)
    normalized = normalize_loudness(sine.astype(np.float32), rate)
    assert integrated_loudness(normalized, rate) == pytest.approx(-24.0, abs=1e-3)


def test_relative_gate_ignores_the_quiet_part():
    rate = 24000
    t = np.arange(2 * rate) / rate
    loud = 0.5 * np.sin(2 * np.pi * 1000 * t)
    with_pause = np.concatenate([loud, 1e-3 * loud])  # 2 s of tone, 2 s of near-silence (-60 dB: gated out)
    ungated = integrated_loudness(loud, rate) - 10 * np.log10(2)  # what plain mean power over 4 s would give
    # Only the blocks straddling the pause (partly loud, above the relative gate) pull it down a little.
    assert integrated_loudness(with_pause, rate) == pytest.approx(integrated_loudness(loud, rate), abs=0.5)
    assert integrated_loudness(with_pause, rate) > ungated + 2


def test_frames_zero_pad_the_last_one():
    frames = frames_of(np.arange(1, 4001, dtype=np.float32), 1920)
    assert frames.shape == (3, 1920)
    assert frames[2, 159] == 4000 and not frames[2, 160:].any()


def test_read_audio_mixes_to_mono_and_resamples(tmp_path: Path):
    import soundfile

    stereo = np.stack([np.full(16000, 0.2), np.full(16000, 0.4)], axis=1).astype(np.float32)
    soundfile.write(tmp_path / "in.wav", stereo, 16000, subtype="FLOAT")
    mono = read_audio(tmp_path / "in.wav", 24000)
    assert mono.dtype == np.float32 and abs(len(mono) - 24000) <= 1
    assert np.allclose(mono[2000:-2000], 0.3, atol=1e-3)


def test_bundle_round_trip_and_lookup(personaplex_checkpoint: Path, tmp_path: Path):
    from engine.personaplex.checkpoint import read_config

    cfg = read_config(personaplex_checkpoint).lm
    folder = voices_dir(personaplex_checkpoint)
    assert list_voices(folder) == ["NATF2"]
    assert find_voice(folder, "NATF2") == find_voice(folder, "NATF2.pt") == folder / "NATF2.pt"
    stored = torch.load(folder / "NATF2.pt", weights_only=True)
    assert stored["embeddings"].shape[1:] == (1, 1, cfg.dim) and stored["cache"].shape == (1, cfg.rows, 4)
    voice = load_bundle(folder / "NATF2.pt", cfg)
    save_voice_bundle(Voice("copy", voice.embeddings, voice.cache), tmp_path / "copy.pt")
    again = load_bundle(tmp_path / "copy.pt", cfg)
    assert torch.equal(again.embeddings, voice.embeddings) and torch.equal(again.cache, voice.cache)


def test_voices_tgz_is_extracted_safely(personaplex_checkpoint: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch):
    import io
    import tarfile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "ckpt"
    root.mkdir()
    with tarfile.open(root / "voices.tgz", "w:gz") as tar:
        tar.add(personaplex_checkpoint / "voices" / "NATF2.pt", arcname="voices/NATF2.pt")
        evil = tarfile.TarInfo("voices/../../evil.pt")
        evil.size = 3
        tar.addfile(evil, io.BytesIO(b"bad"))
    folder = voices_dir(root)
    assert list_voices(folder) == ["NATF2"]
    assert not (tmp_path / "evil.pt").exists() and not (folder.parent.parent / "evil.pt").exists()
    assert not (root / "voices").exists(), "the checkpoint is left as it was"
    assert voices_dir(root) == folder  # extracted once


def test_system_tags_and_persona_tokens(personaplex_checkpoint: Path):
    import sentencepiece

    assert wrap_with_system_tags("  Be kind. ") == "<system> Be kind. <system>"
    assert wrap_with_system_tags("<system> Be kind. <system>") == "<system> Be kind. <system>"
    assert wrap_with_system_tags("<system> Be kind.") == "<system> <system> Be kind. <system>"
    sp = sentencepiece.SentencePieceProcessor(model_file=str(personaplex_checkpoint / "tokenizer_spm_32k_3.model"))
    assert persona_tokens(sp, "") == [] and persona_tokens(sp, None) == []
    tokens = persona_tokens(sp, "Your name is Jane.")
    assert sp.decode(tokens) == "<system> Your name is Jane. <system>"
    assert sp.id_to_piece(3) == "<pad>" and sp.id_to_piece(0) == "<unk>"  # PAD = 3 as in the release


def test_a_clip_voice_is_the_clip_mimi_encoded(personaplex_checkpoint: Path):
    """clip_voice reads any rate, resamples to 24 kHz and encodes as voice_frames does; the length
    limits say what to change."""
    import io

    import soundfile as sf

    from engine.errors import RequestError
    from engine.personaplex import PersonaPlex

    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu")
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)).astype(np.float32)  # 1 s at 24 kHz

    def wav(samples: np.ndarray, rate: int) -> bytes:
        buffer = io.BytesIO()
        sf.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
        return buffer.getvalue()

    voice = engine.clip_voice(wav(tone, 24000))
    assert voice.name == "your clip" and voice.embeddings is None
    torch.testing.assert_close(voice.frames, engine.voice_frames(tone), rtol=0, atol=0)
    assert voice.frames.shape == (13, engine.cfg.lm.codebooks)  # 1 s: 12.5 frames, the last zero-padded
    with pytest.raises(RequestError, match=r"a voice clip must be 80 ms to 30 s long; this one is 0\.04 s"):
        engine.clip_voice(wav(tone[:960], 24000))
    with pytest.raises(RequestError, match=r"this one is 31\.00 s"):
        engine.clip_voice(wav(np.zeros(8000 * 31, np.float32), 8000))

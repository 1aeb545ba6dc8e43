"""The Drama 3 codec: loading codec.pth as released, encode/decode, reference clips in."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.drama3.audio import read_reference_audio
from engine.drama3.codec import RELEASED, CodecConfig, load_codec
from engine.drama3.codec_tiny import TINY_CODEC, write_tiny_codec
from engine.drama3.config import ConfigError
from engine.errors import RequestError

RATE = 44100



@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("codec")
    write_tiny_codec(directory, seed=0)
    return directory


@pytest.fixture(scope="module")
def codec(tiny_dir: Path):
    return load_codec(tiny_dir, "cpu")


def random_codes(codec, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, size, (frames,), generator=g) for size in codec.codebook_sizes])


def wav_bytes(samples: np.ndarray, rate: int = RATE, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def speechlike(seconds: float, rate: int = RATE, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
            + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


# ─── The tiny checkpoint and loading ──────────────────────────────────────────


def test_tiny_codec_is_deterministic_and_keeps_the_release_frame(tmp_path: Path, tiny_dir: Path) -> None:
    files = write_tiny_codec(tmp_path, seed=0)
    assert sorted(f.name for f in files) == ["codec.pth", "codec_config.json"]
    for f in files:
        assert f.read_bytes() == (tiny_dir / f.name).read_bytes()
    other = write_tiny_codec(tmp_path / "seed1", seed=1)
    assert other[0].read_bytes() != files[0].read_bytes()
    config = CodecConfig.from_dict(json.loads((tiny_dir / "codec_config.json").read_text()))
    assert (config.sample_rate, config.frame_samples, config.num_codebooks) == (44100, 2048, 10)
    assert config.codebook_sizes == (4096,) + (1024,) * 9
    assert config.raw["encoder_rates"] == RELEASED["encoder_rates"]
    assert config.raw["decoder_rates"] == RELEASED["decoder_rates"]


def test_weight_norm_is_stored_as_released_and_folded_at_load(tiny_dir: Path, codec) -> None:
    state = torch.load(tiny_dir / "codec.pth", weights_only=True)
    assert "encoder.block.0.conv.parametrizations.weight.original0" in state
    assert "decoder.model.1.block.1.conv.parametrizations.weight.original1" in state
    assert "quantizer.quantizer.quantizers.3.in_proj.weight_g" in state  # DAC's own weight norm
    assert "quantizer.downsample.0.0.conv.weight" in state  # plain conv in the release
    g = state["decoder.model.0.conv.parametrizations.weight.original0"]
    v = state["decoder.model.0.conv.parametrizations.weight.original1"]
    folded = codec.decoder.model[0].conv.weight
    assert torch.allclose(folded, g * v / v.flatten(1).norm(dim=1)[:, None, None], atol=1e-6)
    assert not any("parametrizations" in k for k in codec.state_dict())


def test_training_checkpoint_wrappers_load_the_same_codec(tmp_path: Path, tiny_dir: Path, codec) -> None:
    state = torch.load(tiny_dir / "codec.pth", weights_only=True)
    wrapped = {f"generator.{k}": v for k, v in state.items()}
    wrapped["generator.quantizer.post_module.causal_mask"] = torch.ones(4, 4, dtype=torch.bool)
    wrapped["discriminator.conv.weight"] = torch.zeros(3)
    torch.save({"state_dict": wrapped, "optimizer": {}}, tmp_path / "codec.pth")
    (tmp_path / "codec_config.json").write_text((tiny_dir / "codec_config.json").read_text())
    again = load_codec(tmp_path / "codec.pth")
    codes = random_codes(codec, 12, seed=1)
    assert torch.equal(again.decode(codes), codec.decode(codes))


def test_a_codec_that_does_not_match_its_configuration_is_refused(tmp_path: Path, tiny_dir: Path) -> None:
    state = torch.load(tiny_dir / "codec.pth", weights_only=True)
    config = (tiny_dir / "codec_config.json").read_text()
    (tmp_path / "codec_config.json").write_text(config)

    missing = dict(state)
    del missing["quantizer.post_module.layers.7.attention.wo.weight"]
    torch.save(missing, tmp_path / "codec.pth")
    with pytest.raises(ConfigError, match=r"post_module\.layers\.7\.attention\.wo\.weight"):
        load_codec(tmp_path)

    torch.save({**state, "quantizer.post_module.input_proj.weight": torch.zeros(64, 64)}, tmp_path / "codec.pth")
    with pytest.raises(ConfigError, match=r"unknown .*input_proj"):
        load_codec(tmp_path)

    # Without codec_config.json the released configuration applies: tiny weights do not fit it.
    (tmp_path / "codec_config.json").unlink()
    torch.save(state, tmp_path / "codec.pth")
    with pytest.raises(ConfigError, match="does not match"):
        load_codec(tmp_path)

    (tmp_path / "codec.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a PyTorch state dict"):
        load_codec(tmp_path)
    with pytest.raises(ConfigError, match="no codec"):
        load_codec(tmp_path / "missing")


def test_config_fields_are_checked() -> None:
    with pytest.raises(ConfigError, match="decoder_rates"):
        CodecConfig.from_dict({"decoder_rates": [8, 8, 4]})
    with pytest.raises(ConfigError, match="causal"):
        CodecConfig.from_dict({"quantizer": {"post_module": {"causal": False}}})
    with pytest.raises(ConfigError, match="input_dim"):
        CodecConfig.from_dict({"latent_dim": 512})
    assert CodecConfig.from_dict().frame_samples == 2048


# ─── Decode and encode ────────────────────────────────────────────────────────


def test_decode_makes_non_silent_bounded_audio_of_whole_frames(codec) -> None:
    codes = random_codes(codec, 40, seed=2)
    audio = codec.decode(codes)
    assert audio.dtype == torch.float32 and audio.shape == (40 * 2048,)
    assert 0.05 < audio.std().item() < 0.6 and audio.abs().max().item() < 1.0
    # Different codes, different audio; out-of-range codes are clamped as the release does.
    assert not torch.allclose(audio, codec.decode(random_codes(codec, 40, seed=3)))
    clamped = codes.clone()
    clamped[0, 5], clamped[3, 7] = 4095, 1023
    over = clamped.clone()
    over[0, 5], over[3, 7] = 5000, 4000
    assert torch.equal(codec.decode(over), codec.decode(clamped))


def test_decode_is_causal(codec) -> None:
    codes = random_codes(codec, 30, seed=4)
    whole = codec.decode(codes)
    prefix = codec.decode(codes[:, :17])
    assert torch.allclose(prefix, whole[: 17 * 2048], atol=1e-5)


def test_a_tail_decode_needs_only_the_convolutions_context(codec) -> None:
    """decode_tail: the post transformer over every frame, the convolutions from `start` on.
    With conv_context frames before a frame (or from frame 0) it is the whole decode's; with
    fewer it is not, so conv_context is not larger than the convolutions reach."""
    assert codec.conv_context == 10  # the release's rates and kernels (the tiny codec keeps them): 9.1 frames
    codes = random_codes(codec, 60, seed=5)
    whole = codec.decode_batch(codes[None])  # [1, 60 * 2048]
    fs, context = 2048, codec.conv_context
    for start, frames in ((0, 60), (0, 25), (30, 30), (17, 20)):
        tail = codec.decode_tail(codes[None], start, frames)
        assert tail.shape == (1, frames * fs)
        kept = 0 if start == 0 else context  # frames of the tail that are exact
        assert torch.allclose(tail[:, kept * fs:], whole[:, (start + kept) * fs:(start + frames) * fs], atol=1e-5)
    # Per clip, from a device index: two clips, two starts, in one call.
    both = codec.decode_tail(torch.stack((codes, codes.flip(1))), torch.tensor([30, 40]), 20)  # [2, 20 * fs]
    assert torch.allclose(both[0], codec.decode_tail(codes[None], 30, 20)[0], atol=1e-5)
    assert torch.allclose(both[1], codec.decode_tail(codes.flip(1)[None], 40, 20)[0], atol=1e-5)
    short = codec.decode_tail(codes[None], 30, 30)[:, (context - 2) * fs:context * fs]  # 8 and 9 frames of context
    assert not torch.allclose(short, whole[:, (28 + context) * fs:(30 + context) * fs], atol=1e-3)


def test_the_post_transformer_after_a_memory_is_the_whole_clip_s(codec) -> None:
    """codec_transformer.py: frames after a memory of each layer's keys and values (the last
    window - 1 of them suffice) are the frames of one call over the whole clip; a memory of
    fewer keys is not enough."""
    from engine.drama3.codec_transformer import Memory

    post = codec.quantizer.post_module
    clips = torch.randn(2, post.input_dim, 300, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        whole = post(clips)  # [2, C, 300]
        first = Memory(torch.zeros(2, dtype=torch.long), [], [])
        empty = clips.new_zeros(2, post.n_head, 0, post.head_dim)
        first.keys, first.values = [empty] * len(post.layers), [empty] * len(post.layers)
        post(clips[:, :, :180], first)  # the first 180 frames of both clips, remembered
        past = post.window - 1
        keys = [k[:, :, -past:] for k in first.keys]
        values = [v[:, :, -past:] for v in first.values]
        memory = Memory(torch.tensor([180, 180]), keys, values)
        after = post(clips[:, :, 180:230], memory)  # [2, C, 50]
        assert torch.allclose(after, whole[:, :, 180:230], atol=1e-5)
        short = Memory(torch.tensor([180, 180]), [k[:, :, -past // 2:] for k in keys],
                       [v[:, :, -past // 2:] for v in values])
        assert not torch.allclose(post(clips[:, :, 180:230], short), whole[:, :, 180:230], atol=1e-3)


def test_encode_gives_one_frame_per_2048_samples_in_codebook_range(codec) -> None:
    audio = speechlike(1.0)
    codes = codec.encode(audio)
    assert codes.dtype == torch.int64 and codes.shape == (10, -(-audio.size // 2048))
    assert codes[0].max() < 4096 and codes[1:].max() < 1024 and codes.min() >= 0
    assert len(set(codes[0].tolist())) > 1  # not a constant code
    # Causal: a clip's first frames encode the same whatever follows.
    longer = codec.encode(np.concatenate([audio[: 10 * 2048], speechlike(0.5, seed=9)]))
    assert torch.equal(longer[:, :10], codes[:, :10])


def test_encode_reference_reads_resamples_and_caches(codec) -> None:
    clip = speechlike(1.0, rate=22050)
    stereo = np.stack([clip, clip], axis=1)
    data = wav_bytes(stereo, 22050)
    codec.references.clear()
    codes = codec.encode_reference(data)
    assert codes.shape == (10, -(-44100 // 2048))
    assert codec.encode_reference(data) is codes  # cached by content
    assert np.array_equal(codec.encode_reference(base64.b64encode(data).decode()), codes)
    assert len(codec.references) == 2


# ─── Reference audio ──────────────────────────────────────────────────────────


def test_reference_audio_is_mono_at_44100(tmp_path: Path) -> None:
    left, right = speechlike(0.5, 48000), speechlike(0.5, 48000, seed=1)
    flac = wav_bytes(np.stack([left, right], axis=1), 48000, "FLAC")
    samples = read_reference_audio(flac)
    assert samples.dtype == np.float32 and abs(samples.size - 22050) <= 1
    mono = read_reference_audio(wav_bytes((left + right) / 2, 48000))
    assert np.abs(samples - mono).max() < 1e-3
    (tmp_path / "clip.wav").write_bytes(flac)
    assert np.array_equal(read_reference_audio(tmp_path / "clip.wav"), samples)
    assert np.array_equal(read_reference_audio(base64.b64encode(flac).decode()), samples)
    loud = read_reference_audio(wav_bytes(np.full(4096, 0.9, np.float32) * 3, RATE, "WAV"))
    assert loud.max() <= 1.0


@pytest.mark.parametrize(("data", "message"), [
    (b"this is not audio at all", r"not a readable WAV or FLAC file \(Format not recognised.\)"),
    (b"", "empty"),
    ("@@not base64@@", "not valid base64"),
    (wav_bytes(np.zeros(0, np.float32)), "no samples|not a readable"),
    (wav_bytes(np.zeros(1000, np.float32)), "at least 46 ms"),
    (wav_bytes(np.zeros(8000 * 61, np.float32), 8000), "the limit is 60 s"),
    (wav_bytes(np.full(4096, np.nan, np.float32), RATE, "WAV", "FLOAT"), "NaN"),
    (12345, "WAV/FLAC bytes or base64"),
], ids=["not-audio", "empty", "bad-base64", "no-samples", "too-short", "too-long", "nan", "wrong-type"])
def test_bad_reference_audio_gets_a_clear_error(data, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        read_reference_audio(data)


def test_a_missing_reference_file_is_a_request_error(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="cannot read reference audio file"):
        read_reference_audio(tmp_path / "nope.wav")


def test_tiny_codec_config_overrides_only_what_it_names() -> None:
    config = CodecConfig.from_dict(TINY_CODEC)
    assert config.raw["quantizer"]["pre_module"]["window_size"] == 128
    partial = CodecConfig.from_dict({"decoder_dim": 768})
    assert partial.raw["decoder_dim"] == 768 and partial.raw["encoder_dim"] == RELEASED["encoder_dim"]


def test_a_codec_config_field_the_codec_does_not_have_is_refused_by_name(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^codec_config\.decoder_dimm is not a field of the codec's configuration"):
        CodecConfig.from_dict({"decoder_dimm": 768})
    with pytest.raises(ConfigError, match=r"^codec_config\.quantizer\.pre_module\.config\.n_layers is not a field"):
        CodecConfig.from_dict({"quantizer": {"pre_module": {"config": {"n_layers": 2}}}})
    (tmp_path / "codec.pth").write_bytes((tiny_dir / "codec.pth").read_bytes())
    (tmp_path / "codec_config.json").write_text(json.dumps({**TINY_CODEC, "sample_rte": 16000}))
    with pytest.raises(ConfigError, match=r"codec_config\.sample_rte is not a field"):
        load_codec(tmp_path)

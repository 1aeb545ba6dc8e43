"""Our codec against an independent implementation: sglang-omni 0.1.9's modified DAC.

sglang-omni ships fish-speech's pure-torch `modded_dac.py` and `rvq.py`; they build on
descript-audio-codec 1.0.0 (`dac.nn.layers`, `dac.nn.quantize`). scripts/setup installs
both without their dependencies. The `dac` and `audiotools` package roots import training
tools (audiotools: matplotlib, tensorboard, torchaudio, ...) that the codec's modules never
touch, so the reference files are loaded by path beside bare `dac`/`dac.nn` packages over
the installed directories; only the base classes of the reference's `DAC` wrapper class
(`audiotools.ml.BaseModel`, `dac.model.base.CodecMixin`: save/load and delay helpers) are
stand-ins. Every layer that computes is the reference's own code.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
import types
import unittest.mock
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.drama3.codec import RELEASED, Codec, CodecConfig, load_codec
from engine.drama3.codec_tiny import TINY_CODEC, release_state_dict, write_tiny_codec

# The reference uses torch's old weight_norm and torch.jit.script; both warn, both work.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")



def reference_modules() -> tuple[types.ModuleType, types.ModuleType]:
    try:
        dac_dir = Path(importlib.metadata.distribution("descript-audio-codec").locate_file("dac"))
        sgo_dir = Path(importlib.metadata.distribution("sglang-omni").locate_file(
            "sglang_omni/models/fishaudio_s2_pro/fish_speech/models/dac"))
    except importlib.metadata.PackageNotFoundError as error:
        pytest.fail(f"{error.name} is not installed: run scripts/setup")
    dac = types.ModuleType("dac")
    dac.__path__ = [str(dac_dir)]
    dac_nn = types.ModuleType("dac.nn")
    dac_nn.__path__ = [str(dac_dir / "nn")]
    base = types.ModuleType("dac.model.base")

    class CodecMixin:  # the reference DAC asks it for its delay in __init__ only
        def get_delay(self) -> int:
            return 0

    base.CodecMixin = CodecMixin
    audiotools_ml = types.ModuleType("audiotools.ml")
    audiotools_ml.BaseModel = torch.nn.Module
    stand_ins = {"dac": dac, "dac.nn": dac_nn, "dac.model": types.ModuleType("dac.model"),
                 "dac.model.base": base, "audiotools": types.ModuleType("audiotools"),
                 "audiotools.ml": audiotools_ml}
    loaded = []
    with unittest.mock.patch.dict(sys.modules, stand_ins):
        for name in ("modded_dac", "rvq"):
            spec = importlib.util.spec_from_file_location(f"reference_dac_{name}", sgo_dir / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded.append(module)
    return loaded[0], loaded[1]


def reference_codec(config: dict[str, Any]) -> torch.nn.Module:
    """The reference DAC built from a modded_dac_vq config, as hydra instantiates the yaml."""
    modded_dac, rvq = reference_modules()

    def transformer(module: dict[str, Any]) -> torch.nn.Module:
        return modded_dac.WindowLimitedTransformer(
            config=modded_dac.ModelArgs(**module["config"]), input_dim=module["input_dim"],
            window_size=module["window_size"], causal=module["causal"])

    q = config["quantizer"]
    quantizer = rvq.DownsampleResidualVectorQuantize(
        input_dim=q["input_dim"], n_codebooks=q["n_codebooks"], codebook_size=q["codebook_size"],
        codebook_dim=q["codebook_dim"], quantizer_dropout=q["quantizer_dropout"],
        semantic_codebook_size=q["semantic_codebook_size"], downsample_factor=q["downsample_factor"],
        pre_module=transformer(q["pre_module"]), post_module=transformer(q["post_module"]))
    general = functools.partial(modded_dac.ModelArgs, **config["transformer_general_config"])
    return modded_dac.DAC(
        encoder_dim=config["encoder_dim"], encoder_rates=config["encoder_rates"], latent_dim=config["latent_dim"],
        decoder_dim=config["decoder_dim"], decoder_rates=config["decoder_rates"], quantizer=quantizer,
        sample_rate=config["sample_rate"], causal=True,
        encoder_transformer_layers=config["encoder_transformer_layers"],
        decoder_transformer_layers=config["decoder_transformer_layers"], transformer_general_config=general)


def without_targets(node: Any) -> Any:
    """The yaml as OmegaConf reads it for hydra: no _target_s, and `1e-5` a number
    (YAML 1.1, PyYAML's dialect, reads exponents without a dot as strings)."""
    if isinstance(node, dict):
        return {k: without_targets(v) for k, v in node.items() if k not in ("_target_", "_partial_")}
    if isinstance(node, str):
        try:
            return float(node)
        except ValueError:
            return node
    return node


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Codec, torch.nn.Module]:
    directory = tmp_path_factory.mktemp("codec")
    write_tiny_codec(directory, seed=0)
    reference = reference_codec(CodecConfig.from_dict(TINY_CODEC).raw)
    # strict: the tiny codec.pth has exactly the reference's keys (weight-norm names included).
    reference.load_state_dict(torch.load(directory / "codec.pth", weights_only=True), strict=True)
    return load_codec(directory, "cpu"), reference.eval()


def test_released_configuration_matches_the_release_yaml_and_its_state_dict() -> None:
    import yaml

    path = Path(importlib.metadata.distribution("sglang-omni").locate_file(
        "sglang_omni/models/fishaudio_s2_pro/fish_speech/configs/modded_dac_vq.yaml"))
    released = without_targets(yaml.safe_load(path.read_text()))

    def agree(ours: Any, theirs: Any, where: str) -> None:
        if isinstance(ours, dict):
            for key, value in ours.items():
                if value is not None:
                    agree(value, theirs[key], f"{where}.{key}")
        else:
            assert ours == theirs, where

    agree(RELEASED, released, "RELEASED")
    # The full-size modules, built without memory: same keys, same shapes as the reference.
    with torch.device("meta"):
        ours = release_state_dict(Codec(CodecConfig.from_dict(released)))
        theirs = reference_codec(CodecConfig.from_dict(released).raw).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert sum(v.numel() for v in ours.values()) > 300e6


def test_decode_matches_the_reference(tiny) -> None:
    codec, reference = tiny
    g = torch.Generator().manual_seed(5)
    codes = torch.stack([torch.randint(0, size, (70,), generator=g) for size in codec.codebook_sizes])
    with torch.inference_mode():
        expected = reference.from_indices(codes[None].clone())[0, 0]
    audio = codec.decode(codes)
    assert audio.shape == expected.shape == (70 * 2048,)
    torch.testing.assert_close(audio, expected, rtol=0, atol=1e-5)
    assert expected.std() > 0.05


def test_encode_matches_the_reference(tiny) -> None:
    codec, reference = tiny
    rng = np.random.default_rng(7)
    t = np.arange(int(1.7 * 44100)) / 44100
    audio = (0.4 * np.sin(2 * np.pi * 220 * t * (1 + 0.3 * t)) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    with torch.inference_mode():
        expected, lengths = reference.encode(torch.from_numpy(audio)[None])
    codes = codec.encode(audio)
    assert codes.shape == expected[0].shape and int(lengths[0]) == codes.shape[1]
    assert torch.equal(codes, expected[0])


def snr_db(truth: torch.Tensor, other: torch.Tensor) -> float:
    return float(10 * torch.log10(truth.pow(2).sum() / (truth - other).pow(2).sum().clamp_min(1e-20)))


@pytest.mark.gpu
def test_gpu_numerics_match_the_reference(tmp_path: Path) -> None:
    """On CUDA, as SGLang Omni serves the codec: weight norm folded in float32, encoding
    under bfloat16 autocast (same codes), the decoder in float16 (at least as close to a
    float32 decode as the reference's own float16 decoder: the reference's TorchScript
    Snake switches from per-op float16 to fused float32 after its first calls, so the two
    float16 decodes are not bitwise equal)."""
    write_tiny_codec(tmp_path, seed=0)
    reference = reference_codec(CodecConfig.from_dict(TINY_CODEC).raw)
    reference.load_state_dict(torch.load(tmp_path / "codec.pth", weights_only=True), strict=True)
    reference.eval().fold_weight_norm()
    reference.cuda()
    codec = load_codec(tmp_path, "cuda")
    g = torch.Generator().manual_seed(5)
    codes = torch.stack([torch.randint(0, size, (70,), generator=g) for size in codec.codebook_sizes])
    tf32 = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        with torch.inference_mode():
            latent = reference.quantizer.decode(codes[None].cuda())
            truth = reference.decoder(latent)[0, 0]
            theirs = reference.decoder.half()(latent.half())[0, 0].float()
            reference.decoder.float()
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    ours = codec.decode(codes)
    assert truth.std() > 0.05
    assert snr_db(truth, ours) >= max(40.0, snr_db(truth, theirs) - 0.5), (snr_db(truth, ours), snr_db(truth, theirs))
    for seed in range(3):
        clip = torch.randn(3 * 44100, generator=torch.Generator().manual_seed(seed)) * 0.2
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            expected_codes, _ = reference.encode(clip[None].cuda())
        assert torch.equal(codec.encode(clip), expected_codes[0].cpu())

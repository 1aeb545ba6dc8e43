"""The Drama 3 codec: Fish's modified DAC (`modded_dac_vq`), loaded from codec.pth.

Design choices:
- The released codec.pth holds weights only; `RELEASED` below is the configuration the
  release builds (modded_dac_vq.yaml), in that file's field names. A `codec_config.json`
  beside codec.pth overrides any of its fields (tiny checkpoints carry one), so every
  size still comes from the checkpoint directory; a field the configuration does not have
  is refused by name (`codec_config.decoder_dimm is not a field ...`), except the
  release's training-only ones (TRAINING_FIELDS).
- Loading is a table: module names follow the state-dict keys, with one rename: weight
  norm (`X.parametrizations.weight.original0/1`, or DAC's older `X.weight_g/_v`) is
  folded into `X.weight` here, once. Wrappers of training checkpoints (a `state_dict`
  key, a `generator.` prefix) are accepted. A missing or unknown key is refused by name.
- Numerics follow SGLang Omni, as the seed does: encoding in float32 under bfloat16
  autocast on a GPU; decoding runs the quantiser (embeddings, post transformer,
  upsampling) in float32 and the convolutional decoder in float16 on a GPU, float32 on
  CPU.
- `decode` takes one clip; `decode_batch` takes clips of one length; `decode_tail` decodes
  a tail of each: the post transformer (8 layers, a 128-frame window: it reaches hundreds of
  frames back) runs on every frame, the upsampling and the decoder (short causal
  convolutions, but nearly all the codec's work: they run at up to 2,048 samples a frame)
  only on the frames kept plus `conv_context` frames before them (`retake bench codec`
  decodes the seed's windows with it). A streamed window does the same after its take's
  codec state, the transformer on its new frames only (codec_stream.py). The modules carry
  the batch dimension end to end; each clip's samples depend on its own codes only (no op
  mixes the batch), but a convolution's kernel may change with the batch size, so a clip
  decoded in a batch can differ from the same clip alone in float rounding (~4e-6 in
  float32 on a CPU).
- On a GPU the decoder's Snakes run as one Triton pass each (engine/kernels/snake.py;
  `retake bench codec --window` times a long window's graph with them and without).
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from engine.drama3.audio import read_reference_audio
from engine.drama3.codec_layers import (
    CausalConv,
    CausalConvTranspose,
    Decoder,
    DownsampleQuantizer,
    Encoder,
    Snake,
    VectorQuantizer,
    conv_context,
)
from engine.drama3.codec_transformer import WindowLimitedTransformer
from engine.errors import ConfigError
from engine.kernels.snake import snake_inverse
from engine.readback import to_host

REFERENCE_CACHE_SIZE = 64

_QUANTIZER_TRANSFORMER = {
    "causal": True, "window_size": 128, "input_dim": 1024,
    "config": {"block_size": 2048, "n_layer": 8, "n_head": 16, "dim": 1024, "intermediate_size": 3072,
               "n_local_heads": -1, "head_dim": 64, "rope_base": 10000, "norm_eps": 1e-5, "channels_first": True},
}
# modded_dac_vq.yaml of the release (reference/drama3.md §3.2), without hydra's _target_s.
RELEASED: dict[str, Any] = {
    "sample_rate": 44100,
    "encoder_dim": 64,
    "encoder_rates": [2, 4, 8, 8],
    "latent_dim": None,  # encoder_dim * 2 ** len(encoder_rates)
    "decoder_dim": 1536,
    "decoder_rates": [8, 8, 4, 2],
    "encoder_transformer_layers": [0, 0, 0, 4],
    "decoder_transformer_layers": [4, 0, 0, 0],  # built but never used by the release
    "transformer_general_config": {"block_size": 8192, "n_local_heads": -1, "head_dim": 64,
                                   "rope_base": 10000, "norm_eps": 1e-5, "channels_first": True},
    "quantizer": {
        "input_dim": 1024, "n_codebooks": 9, "codebook_size": 1024, "codebook_dim": 8,
        "quantizer_dropout": 0.5, "downsample_factor": [2, 2], "downsample_dims": None,
        "semantic_codebook_size": 4096,
        "pre_module": _QUANTIZER_TRANSFORMER, "post_module": _QUANTIZER_TRANSFORMER,
    },
}
# Fields of the release's yaml that only train the codec: accepted wherever they appear, unused.
TRAINING_FIELDS = ("dropout_rate", "attn_dropout_rate")
# Keys a checkpoint may carry that are not weights: buffers the modules rebuild.
IGNORED_SUFFIXES = ("causal_mask", "freqs_cis")


def merged(base: Mapping[str, Any], override: Mapping[str, Any], where: str = "codec_config") -> dict[str, Any]:
    """base with override's fields on top, objects merged field by field. A field base does not
    have is refused by name (a misspelt field would otherwise be ignored, and the check that
    fails next would name another); the release's training-only fields are let through."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if key == "_target_" or key == "_partial_":
            continue
        if key not in out and key not in TRAINING_FIELDS:
            raise ConfigError(f"{where}.{key} is not a field of the codec's configuration; its fields are "
                              f"{', '.join(sorted(out))}")
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value, f"{where}.{key}")
        else:
            out[key] = copy.deepcopy(value)
    return out


def positive_ints(value: object) -> bool:
    """A non-empty list of positive integers."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value))


@dataclass(frozen=True)
class CodecConfig:
    """The fields of modded_dac_vq.yaml that shape the model (the rest only train it)."""

    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, override: Mapping[str, Any] | None = None) -> CodecConfig:
        raw = merged(RELEASED, override or {})
        w = "codec_config"
        for name in ("encoder_rates", "decoder_rates"):
            if not positive_ints(raw[name]):
                raise ConfigError(f"{w}.{name} must be a list of positive integers; got {raw[name]!r}")
        if math.prod(raw["encoder_rates"]) != math.prod(raw["decoder_rates"]):
            raise ConfigError(f"{w}: decoder_rates must upsample by what encoder_rates downsample")
        if raw["latent_dim"] is None:
            raw["latent_dim"] = raw["encoder_dim"] * 2 ** len(raw["encoder_rates"])
        layers = raw["encoder_transformer_layers"]
        if not isinstance(layers, list) or len(layers) != len(raw["encoder_rates"]):
            raise ConfigError(f"{w}.encoder_transformer_layers must give one count per encoder rate")
        if raw["decoder_dim"] % 2 ** len(raw["decoder_rates"]):
            raise ConfigError(f"{w}.decoder_dim must halve cleanly {len(raw['decoder_rates'])} times")
        q = raw["quantizer"]
        if q["input_dim"] != raw["latent_dim"]:
            raise ConfigError(f"{w}.quantizer.input_dim={q['input_dim']} must equal latent_dim={raw['latent_dim']}")
        if not positive_ints(q["downsample_factor"]):
            raise ConfigError(f"{w}.quantizer.downsample_factor must be a list of positive integers")
        if q["downsample_dims"] is None:
            q["downsample_dims"] = [q["input_dim"]] * len(q["downsample_factor"])
        for name in ("pre_module", "post_module"):
            module = q[name]
            if module.get("causal") is not True:
                raise ConfigError(f"{w}.quantizer.{name}.causal must be true (the only kind implemented)")
            if module["input_dim"] != q["downsample_dims"][-1]:
                raise ConfigError(f"{w}.quantizer.{name}.input_dim must equal the downsampled width")
            heads = module["config"]
            if heads.get("n_local_heads", -1) not in (-1, heads["n_head"]):
                raise ConfigError(f"{w}.quantizer.{name}.config.n_local_heads must be -1 or n_head")
        return cls(raw)

    @property
    def sample_rate(self) -> int:
        return int(self.raw["sample_rate"])

    @property
    def frame_samples(self) -> int:
        """Samples per code frame: 512 per latent step x 4 latent steps (2,048)."""
        return int(math.prod(self.raw["encoder_rates"]) * math.prod(self.raw["quantizer"]["downsample_factor"]))

    @property
    def num_codebooks(self) -> int:
        return 1 + int(self.raw["quantizer"]["n_codebooks"])

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        q = self.raw["quantizer"]
        return (int(q["semantic_codebook_size"]), *(int(q["codebook_size"]),) * q["n_codebooks"])


def quantizer_transformer(module: Mapping[str, Any]) -> WindowLimitedTransformer:
    c = module["config"]
    return WindowLimitedTransformer(module["input_dim"], c["dim"], c["n_layer"], c["n_head"], c["head_dim"],
                                    c["intermediate_size"], module["window_size"], c["rope_base"], c["norm_eps"])


class Codec(nn.Module):
    """codec.pth's three parts (`encoder`, `quantizer`, `decoder`) and the clip-level API."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        raw, q = config.raw, config.raw["quantizer"]
        self.config = config
        self.sample_rate = config.sample_rate
        self.frame_samples = config.frame_samples
        self.num_codebooks = config.num_codebooks
        self.codebook_sizes = config.codebook_sizes
        self.encoder = Encoder(raw["encoder_dim"], raw["encoder_rates"], raw["latent_dim"],
                               raw["encoder_transformer_layers"], raw["transformer_general_config"])
        self.quantizer = DownsampleQuantizer(
            q["input_dim"], q["n_codebooks"], q["codebook_size"], q["codebook_dim"], q["semantic_codebook_size"],
            q["downsample_factor"], q["downsample_dims"],
            quantizer_transformer(q["pre_module"]), quantizer_transformer(q["post_module"]))
        self.decoder = Decoder(raw["latent_dim"], raw["decoder_dim"], raw["decoder_rates"])
        self.references: collections.OrderedDict[str, NDArray[np.int64]] = collections.OrderedDict()
        # Whole frames back that the upsampling and the decoder reach (9.1 at the release's rates: 10)
        self.conv_context = math.ceil(conv_context([self.quantizer.upsample, self.decoder]))

    @property
    def device(self) -> torch.device:
        return self.first_decoder_conv().weight.device

    @property
    def decoder_dtype(self) -> torch.dtype:
        return self.first_decoder_conv().weight.dtype

    def first_decoder_conv(self) -> nn.Conv1d:
        return cast(CausalConv, self.decoder.model[0]).conv

    @torch.inference_mode()
    def encode(self, samples: NDArray[np.float32] | torch.Tensor) -> torch.Tensor:
        """int64 codes [num_codebooks, ceil(S / frame_samples)] (CPU) of mono samples [S] at
        the codec rate. The clip is zero-padded to whole frames; clamped to [-1, 1]."""
        audio = torch.as_tensor(samples, dtype=torch.float32).to(self.device).clamp(-1.0, 1.0)  # [S]
        frames = math.ceil(audio.numel() / self.frame_samples)
        audio = nn.functional.pad(audio, (0, frames * self.frame_samples - audio.numel()))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            codes = self.quantizer.encode(self.encoder(audio[None, None]))  # [1, N, F]
        return to_host(codes[0].long())

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 waveform [F * frame_samples] (on the codec's device) of codes [N, F]."""
        return self.decode_batch(codes[None])[0]

    @torch.inference_mode()
    def decode_batch(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 waveforms [B, F * frame_samples] (on the codec's device) of codes [B, N, F]."""
        return self.decode_tail(codes, 0, codes.shape[-1])

    @torch.inference_mode()
    def decode_tail(self, codes: torch.Tensor, start: int | torch.Tensor, frames: int) -> torch.Tensor:
        """float32 waveforms [B, frames * frame_samples] of frames [start, start + frames) of
        codes [B, N, F]: the post transformer reads all F frames, the upsampling and the decoder
        only those (`start` per clip, a device tensor [B], or one int). A frame at least
        `conv_context` frames past `start` (or any, with start 0) is the whole clip's decode of
        it, to rounding: a window's new frames need no more of its left context than that."""
        if codes.dim() != 3 or codes.shape[1] != self.num_codebooks:
            raise ValueError(f"the codec decodes codes [batch, {self.num_codebooks}, frames]; got "
                             f"{tuple(codes.shape)}")
        z = self.quantizer.transformed(codes.to(self.device, torch.long))  # [B, C, F]
        if isinstance(start, int):
            z = z[:, :, start:start + frames]  # [B, C, frames]
        else:
            index = start[:, None] + torch.arange(frames, device=z.device)  # [B, frames]
            z = z.gather(2, index[:, None, :].expand(-1, z.shape[1], -1))  # [B, C, frames]
        latent = self.quantizer.upsample(z)  # [B, C, 4 frames]
        out: torch.Tensor = self.decoder(latent.to(self.decoder_dtype))[:, 0].float()  # [B, frames * frame_samples]
        return out

    def encode_reference(self, data: bytes | str | os.PathLike[str]) -> NDArray[np.int64]:
        """Codes [num_codebooks, frames] of a reference clip (WAV/FLAC bytes, base64 text or a
        path), each clip encoded once: an LRU cache keyed by a hash of the content. The
        arrays are read-only (the cache hands out the same one again)."""
        content = Path(data).read_bytes() if isinstance(data, os.PathLike) else data
        key = hashlib.sha256(content.encode() if isinstance(content, str) else content).hexdigest()
        if (codes := self.references.get(key)) is not None:
            self.references.move_to_end(key)
            return codes
        codes = self.encode(read_reference_audio(content, self.sample_rate, self.frame_samples)).numpy()
        codes.flags.writeable = False
        self.references[key] = codes
        while len(self.references) > REFERENCE_CACHE_SIZE:
            self.references.popitem(last=False)
        return codes


# ─── Loading ──────────────────────────────────────────────────────────────────


def read_config(directory: Path) -> CodecConfig:
    path = directory / "codec_config.json"
    if not path.exists():
        return CodecConfig.from_dict()
    try:
        override = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from error
    if not isinstance(override, Mapping):
        raise ConfigError(f"{path} must hold a JSON object")
    return CodecConfig.from_dict(override)


def unwrap(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The generator's weights of codec.pth, or of a training checkpoint that wraps them."""
    if isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if any(key.startswith("generator.") for key in state):
        state = {key.removeprefix("generator."): v for key, v in state.items() if key.startswith("generator.")}
    return {key: v for key, v in state.items() if not key.endswith(IGNORED_SUFFIXES)}


WEIGHT_NORM_NAMES = ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
                     (".weight_g", ".weight_v"))


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """X.(g, v) -> X.weight = g * v / |v|, the norm over every dim but the first."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for g_name, v_name in WEIGHT_NORM_NAMES:
            if key.endswith(g_name):
                stem = key[: -len(g_name)]
                if stem + v_name not in state:
                    raise ConfigError(f"codec.pth has {key} without {stem + v_name}")
                out[stem + ".weight"] = torch._weight_norm(state[stem + v_name].float(), value.float(), 0)
                break
            if key.endswith(v_name):
                break
        else:
            out[key] = value.float() if value.is_floating_point() else value
    return out


def weight_norm_layout(model: nn.Module) -> dict[str, tuple[str, str]]:
    """For each weight the release stores weight-normed: its (g, v) key names."""
    layout: dict[str, tuple[str, str]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (CausalConv, CausalConvTranspose)) and module.weight_norm:
            g, v = WEIGHT_NORM_NAMES[0]
            layout[f"{name}.conv.weight"] = (f"{name}.conv{g}", f"{name}.conv{v}")
        elif isinstance(module, VectorQuantizer):
            g, v = WEIGHT_NORM_NAMES[1]
            for part in module.legacy_weight_norm:
                layout[f"{name}.{part}.weight"] = (f"{name}.{part}{g}", f"{name}.{part}{v}")
    return layout


def load_codec(path: Path | str, device: str | torch.device = "cpu") -> Codec:
    """The codec of codec.pth (or of a checkpoint directory holding it), ready on `device`."""
    path = Path(path)
    if path.is_dir():
        path = path / "codec.pth"
    if not path.exists():
        raise ConfigError(f"no codec at {path}: a Drama 3 checkpoint holds codec.pth")
    config = read_config(path.parent)
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # noqa: BLE001 - the legacy (pre-zip) format cannot be memory-mapped
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise ConfigError(f"{path} is not a PyTorch state dict: {error}") from error
    if not isinstance(state, Mapping):
        raise ConfigError(f"{path} must hold a state dict; got {type(state).__name__}")
    weights = fold_weight_norm(unwrap(state))
    with torch.device("meta"):
        codec = Codec(config)
    expected = set(codec.state_dict())
    missing, unknown = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unknown:
        raise ConfigError(f"{path} does not match its codec configuration: missing {missing[:4]} "
                          f"({len(missing)}), unknown {unknown[:4]} ({len(unknown)})")
    for key, value in codec.state_dict().items():
        if tuple(weights[key].shape) != tuple(value.shape):
            raise ConfigError(f"{path}: {key} has shape {tuple(weights[key].shape)}, the configuration "
                              f"needs {tuple(value.shape)}")
    codec.load_state_dict(weights, assign=True)
    return ready(codec, device)


def ready(codec: Codec, device: str | torch.device) -> Codec:
    """For inference on `device`: float32, but the decoder float16 on a GPU (as SGLang
    Omni's vocoder; the quantiser stays float32), its Snakes one Triton pass each."""
    codec = codec.eval().requires_grad_(False).to(device)
    if codec.device.type == "cuda":
        snakes = [(m, m.alpha.detach().clone()) for m in codec.decoder.modules() if isinstance(m, Snake)]
        codec.decoder.half()
        for snake, alpha in snakes:  # Snake frequencies stay float32, as in SGLang Omni's decoder
            snake.alpha = nn.Parameter(alpha, requires_grad=False)
            snake.inverse = snake_inverse(alpha)  # one Triton pass each (engine/kernels/snake.py)
    return codec

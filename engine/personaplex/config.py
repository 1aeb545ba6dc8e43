"""PersonaPlex configuration: the LM (Helium + depformer) and the Mimi codec.

Design choices:
- Field names are Kyutai's (`moshi.models.loaders._lm_kwargs`, `_mimi_config`), so a
  config reads the same here, in moshi and in the checkpoint. The released
  `nvidia/personaplex-7b-v1` ships an *empty* config.json (reference/personaplex.md §1.9),
  so the released values live here (`RELEASED_LM`, `RELEASED_MIMI`) and a checkpoint's
  config.json overrides them field by field; the tiny checkpoint writes every field.
- Besides the LM fields, config.json may carry Kyutai's file names (`moshi_name`,
  `mimi_name`, `tokenizer_name`, `mimi_config_name`: a JSON file with the Mimi fields)
  and two PersonaPlex constants: `silence_tokens` and `sine_tokens`, the Mimi codes of a
  silent frame and of a 440 Hz sine frame used during the system prompt. Defaults are the
  released values (PP-lm `SILENCE_TOKENS`, `SINE_TOKENS`). `demo_weights: true` marks a
  random-weight checkpoint (the tiny one), so the UI and logs can say its audio is noise.
- `dep_q` is the number of depformer weight sets *stored* (8). PersonaPlex's loader runs
  the depformer for all `n_q` = 16 codebooks (agent then user), filling set t >= 8 from
  set t - 8 (reference §1.4); `depformer_steps` is that 16.
- Anything not implemented (another norm, gating, positional embedding...) is refused
  with a `ConfigError` naming the field, so a checkpoint never runs the wrong maths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.config_fields import config_int, config_number, config_require
from engine.errors import ConfigError

RELEASED_LM: dict[str, Any] = {
    "dim": 4096, "text_card": 32000, "existing_text_padding_id": 3, "n_q": 16, "dep_q": 8,
    "card": 2048, "num_heads": 32, "num_layers": 32, "hidden_scale": 4.125, "causal": True,
    "layer_scale": None, "context": 3000, "max_period": 10000, "gating": "silu",
    "norm": "rms_norm_f32", "positional_embedding": "rope",
    "depformer_dim": 1024, "depformer_dim_feedforward": int(4.125 * 1024), "depformer_num_heads": 16,
    "depformer_num_layers": 6, "depformer_causal": True, "depformer_layer_scale": None,
    "depformer_multi_linear": True, "depformer_context": 8, "depformer_max_period": 10000,
    "depformer_gating": "silu", "depformer_pos_emb": "none", "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}

RELEASED_MIMI: dict[str, Any] = {
    "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
    "seanet": {
        "channels": 1, "dimension": 512, "causal": True, "n_filters": 64, "n_residual_layers": 1,
        "activation": "ELU", "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0,
        "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
        "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": True,
    },
    "quantizer": {"dimension": 256, "n_q": 32, "bins": 2048, "input_dimension": 512, "output_dimension": 512},
    "transformer": {
        "d_model": 512, "num_heads": 8, "num_layers": 8, "causal": True, "layer_scale": 0.01,
        "context": 250, "conv_layout": True, "max_period": 10000, "gating": "none", "norm": "layer_norm",
        "positional_embedding": "rope", "dim_feedforward": 2048, "input_dimension": 512,
        "output_dimensions": [512],
    },
}

RELEASED_FILES = {
    "moshi_name": "model.safetensors",
    "mimi_name": "tokenizer-e351c8d8-checkpoint125.safetensors",
    "tokenizer_name": "tokenizer_spm_32k_3.model",
}
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)  # Mimi codes of a zero frame
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)  # Mimi codes of a 440 Hz, 0.5 amplitude frame
EPAD_TOKEN = 0  # end-of-text padding: never shown
PAD_TOKEN = 3  # text padding (`existing_text_padding_id`), forced during the system prompt
SILENCE_SECONDS = 0.5  # spacer before and after the persona tokens


def _ints(raw: Mapping[str, Any], name: str, where: str, length: int, minimum: int = 0) -> tuple[int, ...]:
    value = raw.get(name)
    if (not isinstance(value, (list, tuple)) or len(value) != length
            or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value)):
        raise ConfigError(f"{where}.{name} must be {length} integers >= {minimum}; got {value!r}")
    return tuple(value)


def gating_hidden(dim: int, dim_feedforward: int) -> int:
    """Moshi's ActivationGating width: 21/8 d for the 4d default, else 2/3 of dim_feedforward."""
    return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


@dataclass(frozen=True)
class LMConfig:
    """Helium temporal transformer, input embeddings, text head and depformer."""

    dim: int
    num_heads: int
    num_layers: int
    ffn_hidden: int  # gated MLP width (11264 released)
    context: int  # KV window in frames (3000 released)
    max_period: float  # rope base
    text_card: int  # text vocabulary; the text initial token is text_card
    card: int  # audio codebook size; the audio initial token is card
    n_q: int  # audio codebooks in the model input: agent n_q/2, then user n_q/2
    dep_q: int  # depformer weight sets stored in the checkpoint
    delays: tuple[int, ...]  # per token row: text, agent codebooks, user codebooks
    depformer_dim: int
    depformer_num_heads: int
    depformer_num_layers: int
    depformer_ffn_hidden: int
    silence_tokens: tuple[int, ...]
    sine_tokens: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.n_q + 1

    @property
    def codebooks(self) -> int:
        """Codebooks per audio stream (8): the Mimi codebooks in use."""
        return self.n_q // 2

    @property
    def depformer_steps(self) -> int:
        return self.n_q

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def ring_columns(self) -> int:
        """Staging ring width CT = max_delay + 3 (PP-lm `_init_streaming_state`)."""
        return self.max_delay + 3

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> LMConfig:
        w = "config"
        for name, value in (("norm", "rms_norm_f32"), ("gating", "silu"), ("positional_embedding", "rope"),
                            ("causal", True), ("layer_scale", None), ("existing_text_padding_id", PAD_TOKEN),
                            ("depformer_multi_linear", True), ("depformer_weights_per_step", True),
                            ("depformer_pos_emb", "none"), ("depformer_gating", "silu"),
                            ("depformer_layer_scale", None)):
            config_require(raw, name, w, value)
        dim, heads = config_int(raw, "dim", w), config_int(raw, "num_heads", w)
        if dim % heads or (dim // heads) % 2:
            raise ConfigError(f"{w}.dim ({dim}) must split into num_heads ({heads}) heads of even size")
        dep_dim, dep_heads = config_int(raw, "depformer_dim", w), config_int(raw, "depformer_num_heads", w)
        if dep_dim % dep_heads:
            raise ConfigError(f"{w}.depformer_dim ({dep_dim}) must divide by depformer_num_heads ({dep_heads})")
        n_q, dep_q = config_int(raw, "n_q", w, 2), config_int(raw, "dep_q", w)
        if n_q % 2 or dep_q > n_q:
            raise ConfigError(f"{w}.n_q ({n_q}) must be even (agent + user streams) and >= dep_q ({dep_q})")
        card = config_int(raw, "card", w, 2)
        delays = _ints(raw, "delays", w, n_q + 1)
        tokens = {}
        for name, default in (("silence_tokens", SILENCE_TOKENS), ("sine_tokens", SINE_TOKENS)):
            tokens[name] = _ints({name: raw.get(name, list(default))}, name, w, n_q // 2)
            if max(tokens[name]) >= card:
                raise ConfigError(f"{w}.{name} must be codes below card ({card}); got {tokens[name]}")
        dep_ff = raw.get("depformer_dim_feedforward")
        dep_ff = int(config_number(raw, "hidden_scale", w) * dep_dim) if dep_ff is None else config_int(
            raw, "depformer_dim_feedforward", w)
        return LMConfig(
            dim=dim, num_heads=heads, num_layers=config_int(raw, "num_layers", w),
            ffn_hidden=gating_hidden(dim, int(config_number(raw, "hidden_scale", w) * dim)),
            context=config_int(raw, "context", w), max_period=config_number(raw, "max_period", w),
            text_card=config_int(raw, "text_card", w, 4), card=card, n_q=n_q, dep_q=dep_q, delays=delays,
            depformer_dim=dep_dim, depformer_num_heads=dep_heads,
            depformer_num_layers=config_int(raw, "depformer_num_layers", w),
            depformer_ffn_hidden=gating_hidden(dep_dim, dep_ff), **tokens)


@dataclass(frozen=True)
class MimiConfig:
    """Mimi: SEANet + transformer encoder, split RVQ, transformer + SEANet decoder."""

    sample_rate: int
    frame_rate: float
    dimension: int  # SEANet latent width (512)
    n_filters: int
    ratios: tuple[int, ...]  # decoder order; the encoder runs them reversed
    kernel_size: int
    residual_kernel_size: int
    last_kernel_size: int
    n_residual_layers: int
    dilation_base: int
    compress: int
    d_model: int
    num_heads: int
    num_layers: int
    context: int
    max_period: float
    dim_feedforward: int
    layer_scale: float
    codebook_dim: int  # quantizer "dimension"
    total_codebooks: int  # quantizer n_q (32 released; the first 8 are used)
    bins: int

    @property
    def hop(self) -> int:
        return math.prod(self.ratios)

    @property
    def frame_size(self) -> int:
        return int(self.sample_rate / self.frame_rate)

    @property
    def downsample(self) -> int:
        """Encoder positions per codec frame (the conv resampler's stride)."""
        return self.frame_size // self.hop

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> MimiConfig:
        w = "mimi"
        seanet, tr, q = raw.get("seanet"), raw.get("transformer"), raw.get("quantizer")
        if not (isinstance(seanet, Mapping) and isinstance(tr, Mapping) and isinstance(q, Mapping)):
            raise ConfigError(f"{w} must have seanet, transformer and quantizer objects")
        config_require(raw, "channels", w, 1)
        for name, value in (("channels", 1), ("causal", True), ("norm", "none"), ("pad_mode", "constant"),
                            ("activation", "ELU"), ("true_skip", True)):
            config_require(seanet, name, f"{w}.seanet", value)
        for name, value in (("causal", True), ("gating", "none"), ("norm", "layer_norm"),
                            ("positional_embedding", "rope"), ("conv_layout", True)):
            config_require(tr, name, f"{w}.transformer", value)
        dimension = config_int(seanet, "dimension", f"{w}.seanet")
        for where, block, name in ((f"{w}.transformer", tr, "d_model"), (f"{w}.transformer", tr, "input_dimension"),
                                   (f"{w}.quantizer", q, "input_dimension"), (f"{w}.quantizer", q, "output_dimension")):
            if block.get(name, dimension) != dimension:
                raise ConfigError(f"{where}.{name} must equal seanet.dimension ({dimension}); got {block.get(name)!r}")
        if tr.get("output_dimensions", [dimension]) != [dimension]:
            raise ConfigError(f"{w}.transformer.output_dimensions must be [{dimension}]")
        ratios = tuple(seanet.get("ratios") or ())
        if not ratios or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ratios):
            raise ConfigError(f"{w}.seanet.ratios must be positive integers; got {ratios!r}")
        cfg = MimiConfig(
            sample_rate=config_int(raw, "sample_rate", w), frame_rate=config_number(raw, "frame_rate", w),
            dimension=dimension, n_filters=config_int(seanet, "n_filters", f"{w}.seanet"), ratios=ratios,
            kernel_size=config_int(seanet, "kernel_size", f"{w}.seanet"),
            residual_kernel_size=config_int(seanet, "residual_kernel_size", f"{w}.seanet"),
            last_kernel_size=config_int(seanet, "last_kernel_size", f"{w}.seanet"),
            n_residual_layers=config_int(seanet, "n_residual_layers", f"{w}.seanet", 0),
            dilation_base=config_int(seanet, "dilation_base", f"{w}.seanet"),
            compress=config_int(seanet, "compress", f"{w}.seanet"),
            d_model=config_int(tr, "d_model", f"{w}.transformer"),
            num_heads=config_int(tr, "num_heads", f"{w}.transformer"),
            num_layers=config_int(tr, "num_layers", f"{w}.transformer"),
            context=config_int(tr, "context", f"{w}.transformer"),
            max_period=config_number(tr, "max_period", f"{w}.transformer"),
            dim_feedforward=config_int(tr, "dim_feedforward", f"{w}.transformer"),
            layer_scale=config_number(tr, "layer_scale", f"{w}.transformer"),
            codebook_dim=config_int(q, "dimension", f"{w}.quantizer"),
            total_codebooks=config_int(q, "n_q", f"{w}.quantizer", 2),
            bins=config_int(q, "bins", f"{w}.quantizer", 2))
        if cfg.frame_size % cfg.hop or cfg.frame_size != cfg.sample_rate / cfg.frame_rate:
            raise ConfigError(f"{w}: a frame ({cfg.sample_rate}/{cfg.frame_rate} samples) must be a whole number "
                              f"of encoder hops ({cfg.hop})")
        if cfg.d_model % cfg.num_heads or (cfg.d_model // cfg.num_heads) % 2:
            raise ConfigError(f"{w}.transformer.d_model must split into num_heads heads of even size")
        return cfg


@dataclass(frozen=True)
class PersonaPlexConfig:
    lm: LMConfig
    mimi: MimiConfig
    files: dict[str, str]  # moshi_name, mimi_name, tokenizer_name
    demo_weights: bool = False  # config.json "demo_weights": random weights (the tiny checkpoint)

    @staticmethod
    def from_dicts(lm_raw: Mapping[str, Any], mimi_raw: Mapping[str, Any] | None) -> PersonaPlexConfig:
        """`lm_raw` is config.json (possibly empty); `mimi_raw` the Mimi config file, if any."""
        lm_raw = dict(lm_raw)
        files = {name: str(lm_raw.pop(name, default)) for name, default in RELEASED_FILES.items()}
        demo = lm_raw.pop("demo_weights", False) is True
        lm = LMConfig.from_dict({**RELEASED_LM, **lm_raw})
        mimi = MimiConfig.from_dict(RELEASED_MIMI if mimi_raw is None else mimi_raw)
        if mimi.bins != lm.card:
            raise ConfigError(f"config.card ({lm.card}) must equal the Mimi quantizer bins ({mimi.bins})")
        if lm.codebooks > mimi.total_codebooks:
            raise ConfigError(f"config.n_q/2 ({lm.codebooks}) must not exceed the Mimi quantizer n_q "
                              f"({mimi.total_codebooks})")
        return PersonaPlexConfig(lm=lm, mimi=mimi, files=files, demo_weights=demo)

"""Drama 3 configuration, parsed from the checkpoint's own config.json.

Design choices:
- Every size comes from config.json; nothing in the engine hard-codes a dimension. The
  two presets below (`tiny`, `full`) are config.json dicts, so they go through the same
  parser as a real checkpoint.
- Frozen dataclasses, one per part (`TextConfig`, `TowerConfig`, `Drama3Config`).
- Anything we do not implement is refused with a `ConfigError` naming the field, so a
  checkpoint never loads into the wrong maths silently.
- The `full` preset is Qwen3.5-35B-A3B as `transformers` documents it; fields marked
  ASSUMED below are not confirmed for Drama 3 (reference/drama3.md §1.2, §8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.config_fields import config_int, config_number, config_require
from engine.errors import ConfigError

SPEECH_TEMPLATE_VERSION = "reference-bracket-v1"
FISH_SCHEMA_VERSION = 1
TEXT_MODEL_TYPES = ("fish_omni_text", "qwen3_5_moe_text")
TOWER_MODEL_TYPE = "fish_qwen3_audio_decoder"
QUANT_METHOD = "bsgemm-moe"
FP8_BLOCK = (128, 128)


@dataclass(frozen=True)
class TextConfig:
    """The Qwen3.5-MoE hybrid backbone."""

    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # "linear_attention" | "full_attention" per layer
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # MoE
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "full_attention")

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "linear_attention")

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def from_dict(cls, raw: object) -> TextConfig:
        w = "text_config"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{w} must be an object; got {raw!r}")
        if raw.get("model_type") not in TEXT_MODEL_TYPES:
            raise ConfigError(f"{w}.model_type must be one of {TEXT_MODEL_TYPES}; got {raw.get('model_type')!r}")
        layers = config_int(raw, "num_hidden_layers", w)
        layer_types = raw.get("layer_types")
        if (not isinstance(layer_types, list) or len(layer_types) != layers
                or not set(layer_types) <= {"linear_attention", "full_attention"}
                or "full_attention" not in layer_types):
            raise ConfigError(f"{w}.layer_types must name linear_attention or full_attention for each "
                              f"of the {layers} layers, with at least one full_attention; got {layer_types!r}")
        interval = layer_types.index("full_attention") + 1
        if any((kind == "full_attention") != ((i + 1) % interval == 0) for i, kind in enumerate(layer_types)):
            raise ConfigError(f"{w}.layer_types must put full_attention on every {interval}th layer")
        if "full_attention_interval" in raw and raw["full_attention_interval"] != interval:
            raise ConfigError(f"{w}.full_attention_interval={raw['full_attention_interval']!r} "
                              f"disagrees with layer_types (every {interval}th layer)")
        if raw.get("mlp_layer_types", ["moe"] * layers) != ["moe"] * layers:
            raise ConfigError(f"{w}.mlp_layer_types must be 'moe' for every layer")
        config_require(raw, "hidden_act", w, "silu", "silu")
        config_require(raw, "attn_output_gate", w, True, True)
        config_require(raw, "use_qk_norm", w, True, True)
        config_require(raw, "rotary_interleaved", w, False, False)
        config_require(raw, "layernorm_zero_centered_gamma", w, True, True)
        config_require(raw, "shared_expert_gate", w, True, True)
        config_require(raw, "tie_word_embeddings", w, False, False)
        rope = raw.get("rope_parameters")
        if rope is None:  # older exports keep rope fields at the top level
            rope = {"rope_type": "default", "rope_theta": raw.get("rope_theta"),
                    "partial_rotary_factor": raw.get("partial_rotary_factor", 1.0)}
        if not isinstance(rope, Mapping):
            raise ConfigError(f"{w}.rope_parameters must be an object; got {rope!r}")
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ConfigError(f"{w}.rope_parameters.rope_type must be 'default' (scaled rope is not "
                              f"implemented); got {rope.get('rope_type', rope.get('type'))!r}")
        if "mrope_section" in rope:
            raise ConfigError(f"{w}.rope_parameters.mrope_section is not supported")
        config = cls(
            hidden_size=config_int(raw, "hidden_size", w),
            num_hidden_layers=layers,
            layer_types=tuple(layer_types),
            vocab_size=config_int(raw, "vocab_size", w),
            rms_norm_eps=config_number(raw, "rms_norm_eps", w, default=1e-6),
            max_position_embeddings=config_int(raw, "max_position_embeddings", w),
            num_attention_heads=config_int(raw, "num_attention_heads", w),
            num_key_value_heads=config_int(raw, "num_key_value_heads", w),
            head_dim=config_int(raw, "head_dim", w),
            rope_theta=config_number(rope, "rope_theta", f"{w}.rope_parameters"),
            partial_rotary_factor=config_number(rope, "partial_rotary_factor", f"{w}.rope_parameters", 1.0, 1.0),
            linear_num_key_heads=config_int(raw, "linear_num_key_heads", w),
            linear_num_value_heads=config_int(raw, "linear_num_value_heads", w),
            linear_key_head_dim=config_int(raw, "linear_key_head_dim", w),
            linear_value_head_dim=config_int(raw, "linear_value_head_dim", w),
            linear_conv_kernel_dim=config_int(raw, "linear_conv_kernel_dim", w),
            num_experts=config_int(raw, "num_experts", w),
            num_experts_per_tok=config_int(raw, "num_experts_per_tok", w),
            moe_intermediate_size=config_int(raw, "moe_intermediate_size", w),
            shared_expert_intermediate_size=config_int(raw, "shared_expert_intermediate_size", w),
        )
        if config.num_attention_heads % config.num_key_value_heads:
            raise ConfigError(f"{w}.num_attention_heads must be a multiple of num_key_value_heads")
        if config.linear_num_value_heads % config.linear_num_key_heads:
            raise ConfigError(f"{w}.linear_num_value_heads must be a multiple of linear_num_key_heads")
        if config.num_experts_per_tok > config.num_experts:
            raise ConfigError(f"{w}.num_experts_per_tok exceeds num_experts")
        if config.rotary_dim == 0 or config.rotary_dim % 2:
            raise ConfigError(f"{w}: head_dim * partial_rotary_factor must be a positive even width")
        return config


@dataclass(frozen=True)
class TowerConfig:
    """The codebook-MTP audio decoder (`audio_decoder_config`)."""

    dim: int
    n_head: int
    n_local_heads: int
    head_dim: int
    n_layer: int  # shared layers (= shared_enrichment_layers)
    intermediate_size: int
    norm_eps: float
    num_codebooks: int  # 10: code0 (semantic) + 9 residual
    vocab_size: int  # 4096 rows per codebook
    rope_base: float
    rotary_percent: float
    vq_feature_placement: str  # "backbone_partial" | "mtp_shared_pre"
    vq_backbone_codebooks: int  # K_b: residual codebooks summed into the backbone input

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_percent)

    @property
    def residual_layers(self) -> int:
        return self.num_codebooks - 1

    @classmethod
    def from_dict(cls, raw: object, text_dim: int) -> TowerConfig:
        w = "audio_decoder_config"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{w} must be an object; got {raw!r}")
        config_require(raw, "model_type", w, TOWER_MODEL_TYPE, TOWER_MODEL_TYPE)
        config_require(raw, "decoder_type", w, "codebook_mtp_shared")
        config_require(raw, "vq_feature_scope", w, "all_vq", "all_vq")
        config_require(raw, "attention_output_gate", w, True)
        config_require(raw, "layernorm_zero_centered_gamma", w, True)
        for name in ("use_moe", "mtp_use_swa", "attention_qkv_bias", "attention_o_bias"):
            config_require(raw, name, w, False, False)
        for name in ("window_size", "window_attn_skip_freq", "window_rotary_base"):
            config_require(raw, name, w, None)
        if raw.get("dropout", 0.0) != 0.0:
            raise ConfigError(f"{w}.dropout must be 0")
        config = cls(
            dim=config_int(raw, "dim", w),
            n_head=config_int(raw, "n_head", w),
            n_local_heads=config_int(raw, "n_local_heads", w),
            head_dim=config_int(raw, "head_dim", w),
            n_layer=config_int(raw, "n_layer", w),
            intermediate_size=config_int(raw, "intermediate_size", w),
            norm_eps=config_number(raw, "norm_eps", w, default=1e-6),
            num_codebooks=config_int(raw, "num_codebooks", w, 2),
            vocab_size=config_int(raw, "vocab_size", w),
            rope_base=config_number(raw, "rope_base", w),
            rotary_percent=config_number(raw, "rotary_percent", w, 1.0),
            vq_feature_placement=str(raw.get("vq_feature_placement")),
            vq_backbone_codebooks=config_int(raw, "vq_backbone_codebooks", w, 0),
        )
        if config.dim != text_dim or raw.get("text_dim", text_dim) != text_dim:
            raise ConfigError(f"{w}.dim={config.dim} must equal text_config.hidden_size={text_dim}")
        if raw.get("shared_enrichment_layers", config.n_layer) != config.n_layer:
            raise ConfigError(f"{w}.n_layer must equal shared_enrichment_layers")
        if raw.get("max_seq_len", config.num_codebooks + 1) != config.num_codebooks + 1:
            raise ConfigError(f"{w}.max_seq_len must be num_codebooks + 1 = {config.num_codebooks + 1}")
        if config.n_head % config.n_local_heads:
            raise ConfigError(f"{w}.n_head must be a multiple of n_local_heads")
        if config.rotary_dim == 0 or config.rotary_dim % 2:
            raise ConfigError(f"{w}: head_dim * rotary_percent must be a positive even width")
        if config.vq_feature_placement == "backbone_partial":
            if not 1 <= config.vq_backbone_codebooks <= config.num_codebooks - 1:
                raise ConfigError(f"{w}.vq_backbone_codebooks must be in 1..{config.num_codebooks - 1} "
                                  f"for backbone_partial")
        elif config.vq_feature_placement == "mtp_shared_pre":
            if config.vq_backbone_codebooks:
                raise ConfigError(f"{w}.vq_backbone_codebooks must be 0 for mtp_shared_pre")
        else:
            raise ConfigError(f"{w}.vq_feature_placement must be 'backbone_partial' or 'mtp_shared_pre'; "
                              f"got {config.vq_feature_placement!r}")
        return config


@dataclass(frozen=True)
class Drama3Config:
    text: TextConfig
    tower: TowerConfig
    semantic_start_token_id: int
    semantic_end_token_id: int
    eos_token_id: int
    audio_pad_token_id: int | None
    fp8_experts: bool  # quantization_config bsgemm-moe: experts FP8 with 128x128 block scales

    @property
    def num_codebooks(self) -> int:
        return self.tower.num_codebooks

    @property
    def codebook_size(self) -> int:
        return self.tower.vocab_size

    @property
    def frame_width(self) -> int:
        """A frame row: [main token, code0 .. code{n-1}]."""
        return 1 + self.tower.num_codebooks

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Drama3Config:
        if not isinstance(raw, Mapping):
            raise ConfigError("config.json must hold a JSON object")
        config_require(raw, "model_type", "config", "fish_omni", "fish_omni")
        config_require(raw, "speech_template_version", "config", SPEECH_TEMPLATE_VERSION)
        config_require(raw, "fish_schema_version", "config", FISH_SCHEMA_VERSION, FISH_SCHEMA_VERSION)
        if raw.get("audio_encoder_config") is not None:
            raise ConfigError("config.audio_encoder_config must be null (not implemented)")
        if raw.get("extra_samplable_token_ids"):
            raise ConfigError("config.extra_samplable_token_ids must be empty (not implemented)")
        text = TextConfig.from_dict(raw.get("text_config"))
        tower = TowerConfig.from_dict(raw.get("audio_decoder_config"), text.hidden_size)
        start = config_int(raw, "semantic_start_token_id", "config", 0)
        end = config_int(raw, "semantic_end_token_id", "config", 0)
        eos = config_int(raw, "eos_token_id", "config", 0)
        if end - start + 1 != tower.vocab_size:
            raise ConfigError(f"config.semantic_start_token_id..semantic_end_token_id spans {end - start + 1} "
                              f"ids; audio_decoder_config.vocab_size is {tower.vocab_size}")
        if end >= text.vocab_size or eos >= text.vocab_size:
            raise ConfigError(f"config: token ids must lie inside text_config.vocab_size={text.vocab_size}")
        if start <= eos <= end:
            raise ConfigError(f"config.eos_token_id={eos} lies inside the semantic band")
        fp8_experts = _quantization(raw.get("quantization_config"))
        if fp8_experts:
            for name in ("hidden_size", "moe_intermediate_size"):
                if getattr(text, name) % FP8_BLOCK[0]:
                    raise ConfigError(f"text_config.{name}={getattr(text, name)} must be a multiple of "
                                      f"{FP8_BLOCK[0]} for block-FP8 experts")
        pad = raw.get("audio_pad_token_id")
        return cls(text=text, tower=tower, semantic_start_token_id=start, semantic_end_token_id=end,
                   eos_token_id=eos, audio_pad_token_id=pad if isinstance(pad, int) else None,
                   fp8_experts=fp8_experts)


def _quantization(raw: Any) -> bool:
    if raw is None:
        return False
    w = "quantization_config"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{w} must be an object or absent; got {raw!r}")
    config_require(raw, "quant_method", w, QUANT_METHOD)
    config_require(raw, "activation_scheme", w, "dynamic")
    if list(raw.get("weight_block_size") or []) != list(FP8_BLOCK):
        raise ConfigError(f"{w}.weight_block_size must be {list(FP8_BLOCK)}; got {raw.get('weight_block_size')!r}")
    return True


# ─── Presets (config.json dicts) ────────────────────────────────────────────


def _layer_types(layers: int, interval: int = 4) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def config_dict(*, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                linear_k_heads: int, linear_v_heads: int, linear_head_dim: int,
                experts: int, top_k: int, moe_inter: int, shared_inter: int,
                tower_inter: int, semantic_start: int, eos: int, vocab: int,
                rope_theta: float, max_positions: int, vq_backbone_codebooks: int) -> dict[str, Any]:
    """A config.json in the released layout (field names as the checkpoint stores them)."""
    codebook = 4096
    return {
        "architectures": ["FishOmniModel"],
        "model_type": "fish_omni",
        "fish_schema_version": FISH_SCHEMA_VERSION,
        "speech_template_version": SPEECH_TEMPLATE_VERSION,
        "extra_samplable_token_ids": [],
        "audio_encoder_config": None,
        "semantic_start_token_id": semantic_start,
        "semantic_end_token_id": semantic_start + codebook - 1,
        "eos_token_id": eos,
        "audio_pad_token_id": None,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": QUANT_METHOD, "activation_scheme": "dynamic",
                                "weight_block_size": list(FP8_BLOCK)},
        "text_config": {
            "model_type": "fish_omni_text",
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "layer_types": _layer_types(layers),
            "mlp_layer_types": ["moe"] * layers,
            "vocab_size": vocab,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": max_positions,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta,
                                "partial_rotary_factor": 0.25},
            "linear_num_key_heads": linear_k_heads,
            "linear_num_value_heads": linear_v_heads,
            "linear_key_head_dim": linear_head_dim,
            "linear_value_head_dim": linear_head_dim,
            "linear_conv_kernel_dim": 4,
            "num_experts": experts,
            "num_experts_per_tok": top_k,
            "moe_intermediate_size": moe_inter,
            "shared_expert_intermediate_size": shared_inter,
            "hidden_act": "silu",
            "attn_output_gate": True,
            "use_qk_norm": True,
            "rotary_interleaved": False,
            "layernorm_zero_centered_gamma": True,
            "shared_expert_gate": True,
            "tie_word_embeddings": False,
        },
        "audio_decoder_config": {
            "model_type": TOWER_MODEL_TYPE,
            "decoder_type": "codebook_mtp_shared",
            "dim": hidden,
            "text_dim": hidden,
            "n_head": heads,
            "n_local_heads": kv_heads,
            "head_dim": head_dim,
            "n_layer": 4,
            "shared_enrichment_layers": 4,
            "intermediate_size": tower_inter,
            "norm_eps": 1e-6,
            "num_codebooks": 10,
            "vocab_size": codebook,
            "max_seq_len": 11,
            "rope_base": 1e7,
            "rotary_percent": 0.25,
            "rotary_interleaved": True,
            "attention_qk_norm": False,  # an exporter default; the tower always has q/k norms
            "attention_output_gate": True,
            "layernorm_zero_centered_gamma": True,
            "vq_feature_scope": "all_vq",
            "vq_feature_placement": "backbone_partial" if vq_backbone_codebooks else "mtp_shared_pre",
            "vq_backbone_codebooks": vq_backbone_codebooks,
        },
    }


# Tiny: every FP8 expert matrix is one or two 128x128 blocks; fast on 2 CPU cores.
# Vocabulary: 256 bytes + specials + 4,096 semantic tokens (see tokenizer.py for ids).
TINY: dict[str, Any] = dict(hidden=128, layers=4, heads=2, kv_heads=1, head_dim=64,
            linear_k_heads=2, linear_v_heads=4, linear_head_dim=32,
            experts=8, top_k=2, moe_inter=128, shared_inter=128, tower_inter=256,
            rope_theta=1e7, max_positions=32768, vq_backbone_codebooks=3)

# Qwen3.5-35B-A3B as transformers documents it. ASSUMED for Drama 3 (not confirmed):
# moe/shared intermediate 512, linear heads 16/32 x 128, rope_theta 1e7, tower
# intermediate size, vq_backbone_codebooks. Confirmed: hidden 2048, 40 layers with full
# attention every 4th, 16/2 heads x 256, 256 experts top-8, 4,096-code semantic band,
# 252,288 lm_head rows.
FULL: dict[str, Any] = dict(hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256,
            linear_k_heads=16, linear_v_heads=32, linear_head_dim=128,
            experts=256, top_k=8, moe_inter=512, shared_inter=512, tower_inter=6144,
            rope_theta=1e7, max_positions=32768, vq_backbone_codebooks=3,
            semantic_start=248_192, eos=248_046, vocab=252_288)


def preset(name: str, **token_ids: int) -> dict[str, Any]:
    """config.json of a named preset; the tiny one takes its token ids from its tokenizer."""
    if name == "full":
        return config_dict(**FULL)
    if name == "tiny":
        return config_dict(**TINY, **token_ids)
    raise ConfigError(f"unknown preset {name!r}; choose 'tiny' or 'full'")

"""config.json parsing: both presets parse, and a value we cannot run is refused by its field name."""

from __future__ import annotations

import copy

import pytest

from engine.drama3.config import ConfigError, Drama3Config, preset
from engine.drama3.tiny import tiny_config
from engine.errors import RequestError


def test_presets_parse() -> None:
    tiny = Drama3Config.from_dict(tiny_config())
    assert tiny.text.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert tiny.fp8_experts and tiny.frame_width == 11 and tiny.codebook_size == 4096
    assert tiny.text.rotary_dim == 16 and tiny.tower.rotary_dim == 16
    full = Drama3Config.from_dict(preset("full"))
    assert full.text.hidden_size == 2048 and full.text.num_hidden_layers == 40
    assert len(full.text.full_attention_layers) == 10 and full.text.num_experts == 256
    assert full.semantic_end_token_id - full.semantic_start_token_id + 1 == 4096


def edited(path: tuple[str, ...], value) -> dict:
    raw = copy.deepcopy(tiny_config())
    target = raw
    for name in path[:-1]:
        target = target[name]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


@pytest.mark.parametrize(("path", "value", "named"), [
    (("text_config", "hidden_size"), 0, "text_config.hidden_size"),
    (("text_config", "num_key_value_heads"), 3, "text_config.num_attention_heads"),
    (("text_config", "layer_types"), ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
     "text_config.layer_types"),
    (("text_config", "use_qk_norm"), False, "text_config.use_qk_norm"),
    (("text_config", "rope_parameters"), {"rope_type": "yarn", "rope_theta": 1e7}, "rope_type"),
    (("text_config", "moe_intermediate_size"), 96, "text_config.moe_intermediate_size"),
    (("audio_decoder_config", "decoder_type"), "fast_ar", "audio_decoder_config.decoder_type"),
    (("audio_decoder_config", "vq_backbone_codebooks"), 10, "audio_decoder_config.vq_backbone_codebooks"),
    (("audio_decoder_config", "num_codebooks"), KeyError, "audio_decoder_config.num_codebooks"),
    (("semantic_start_token_id",), 7, "semantic_start_token_id"),
    (("speech_template_version",), "v2", "config.speech_template_version"),
    (("quantization_config", "quant_method"), "fp8", "quantization_config.quant_method"),
])
def test_bad_values_are_named(path, value, named: str) -> None:
    with pytest.raises(ConfigError) as error:
        Drama3Config.from_dict(edited(path, value))
    assert named in str(error.value)
    assert isinstance(error.value, RequestError)


def test_bf16_experts_need_no_block_alignment() -> None:
    raw = edited(("quantization_config",), None)
    raw["text_config"]["moe_intermediate_size"] = 96
    assert not Drama3Config.from_dict(raw).fp8_experts

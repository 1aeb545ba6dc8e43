"""`retake make-checkpoint tiny`: the released layout, deterministic bytes, sane random activations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from engine.drama3.config import Drama3Config
from engine.drama3.tiny import checkpoint_tensors, tiny_config
from engine.drama3.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[3]
# Names as the released checkpoint spells them (reference/drama3.md §1.4, §4).
RELEASED_KEYS = (
    "model.language_model.embed_tokens.weight",
    "model.language_model.norm.weight",
    "model.language_model.layers.0.input_layernorm.weight",
    "model.language_model.layers.0.post_attention_layernorm.weight",
    "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
    "model.language_model.layers.0.linear_attn.in_proj_z.weight",
    "model.language_model.layers.0.linear_attn.in_proj_a.weight",
    "model.language_model.layers.0.linear_attn.in_proj_b.weight",
    "model.language_model.layers.0.linear_attn.out_proj.weight",
    "model.language_model.layers.0.linear_attn.conv1d.weight",
    "model.language_model.layers.0.linear_attn.A_log",
    "model.language_model.layers.0.linear_attn.dt_bias",
    "model.language_model.layers.0.linear_attn.norm.weight",
    "model.language_model.layers.3.self_attn.q_proj.weight",
    "model.language_model.layers.3.self_attn.k_proj.weight",
    "model.language_model.layers.3.self_attn.v_proj.weight",
    "model.language_model.layers.3.self_attn.o_proj.weight",
    "model.language_model.layers.3.self_attn.q_norm.weight",
    "model.language_model.layers.3.self_attn.k_norm.weight",
    "model.language_model.layers.1.mlp.gate.weight",
    "model.language_model.layers.1.mlp.shared_expert.gate_proj.weight",
    "model.language_model.layers.1.mlp.shared_expert.up_proj.weight",
    "model.language_model.layers.1.mlp.shared_expert.down_proj.weight",
    "model.language_model.layers.1.mlp.shared_expert_gate.weight",
    "model.language_model.layers.1.mlp.experts.7.gate_proj.weight",
    "model.language_model.layers.1.mlp.experts.7.up_proj.weight_scale_inv",
    "model.language_model.layers.1.mlp.experts.7.down_proj.weight",
    "lm_head.weight",
    "audio_decoder.codebook_embeddings.weight",
    "audio_decoder_mtp_shared.layers.3.semantic_embedding.weight",
    "audio_decoder_mtp_shared.layers.0.enorm.weight",
    "audio_decoder_mtp_shared.layers.0.hnorm.weight",
    "audio_decoder_mtp_shared.layers.0.eh_proj.weight",
    "audio_decoder_mtp_shared.layers.0.final_layernorm.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.attention.wqkv.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.attention.wo.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.attention.q_norm.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.attention.k_norm.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.attention_norm.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.ffn_norm.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.feed_forward.w1.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.feed_forward.w2.weight",
    "audio_decoder_mtp_shared.layers.0.transformer_layer.feed_forward.w3.weight",
    "audio_decoder_mtp.layers.8.codebook_embedding.weight",
    "audio_decoder_mtp.layers.8.transformer_layer.attention.wqkv.weight",
    "audio_decoder_mtp.heads.0.weight",
    "audio_decoder_mtp.heads.8.weight",
)


def test_layout_is_the_released_one(tiny_checkpoint: Path) -> None:
    names = {p.name for p in tiny_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json", "codec.pth"} <= names
    config = Drama3Config.from_dict(json.loads((tiny_checkpoint / "config.json").read_text()))
    assert config.fp8_experts and config.text.num_hidden_layers == 4 and config.text.num_experts == 8
    index = json.loads((tiny_checkpoint / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    tensors = {}
    for shard in shards:
        with safe_open(tiny_checkpoint / shard, framework="pt") as reader:
            assert set(reader.keys()) == {k for k, v in index["weight_map"].items() if v == shard}
            tensors.update({key: reader.get_tensor(key) for key in reader.keys()})
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert set(RELEASED_KEYS) <= tensors.keys()
    prefixes = ("model.language_model.", "lm_head.", "audio_decoder.", "audio_decoder_mtp_shared.",
                "audio_decoder_mtp.")
    assert all(key.startswith(prefixes) for key in tensors)
    experts = [k for k in tensors if ".mlp.experts." in k]
    assert len(experts) == 4 * 8 * 3 * 2  # layers x experts x projections x (weight, scale)
    gate = tensors["model.language_model.layers.1.mlp.experts.7.gate_proj.weight"]
    scale = tensors["model.language_model.layers.1.mlp.experts.7.gate_proj.weight_scale_inv"]
    assert gate.dtype == torch.float8_e4m3fn and gate.shape == (128, 128)
    assert scale.dtype == torch.float32 and scale.shape == (1, 1)
    assert tensors["lm_head.weight"].shape == (config.text.vocab_size, 128)
    assert tensors["audio_decoder.codebook_embeddings.weight"].shape == (10 * 4096, 128)
    assert tensors["model.language_model.layers.0.linear_attn.conv1d.weight"].shape == (256, 1, 4)
    assert tensors["model.language_model.embed_tokens.weight"].dtype == torch.bfloat16
    tokenizer = load_tokenizer(tiny_checkpoint / "tokenizer.json")
    assert tokenizer.token_to_id("<|im_end|>") == config.eos_token_id
    assert tokenizer.token_to_id("<|semantic:4095|>") == config.semantic_end_token_id


def test_command_writes_the_same_bytes_for_the_same_seed(tiny_checkpoint: Path, tmp_path: Path) -> None:
    target = tmp_path / "again"
    command = [sys.executable, "-m", "backend.cli", "make-checkpoint", "tiny", str(target), "--seed", "0"]
    result = subprocess.run(command,
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["seed"] == 0 and "model-00001-of-00002.safetensors" in report["files"]
    assert sorted(report["files"]) == sorted(p.name for p in tiny_checkpoint.iterdir())
    for name in report["files"]:
        assert (target / name).read_bytes() == (tiny_checkpoint / name).read_bytes(), name


def test_another_seed_draws_other_weights() -> None:
    config = Drama3Config.from_dict(tiny_config())
    first, second = checkpoint_tensors(config, seed=0), checkpoint_tensors(config, seed=1)
    assert first.keys() == second.keys()
    assert not torch.equal(first["lm_head.weight"], second["lm_head.weight"])


def test_random_init_gives_sane_activations(tiny_model) -> None:
    model, config, _ = tiny_model
    model.setup_caches(1, 64, "cpu", torch.float32)
    frames = torch.zeros(1, 48, 11, dtype=torch.long)
    frames[0, :16, 0] = torch.arange(65, 81)
    frames[0, 16:, 1] = torch.arange(32) * 100
    frames[0, 16:, 2:] = torch.arange(32)[:, None] * 30 + torch.arange(9)
    frames[0, 16:, 0] = frames[0, 16:, 1] + config.semantic_start_token_id
    residual = []
    hook = model.backbone.norm.register_forward_hook(lambda module, args, out: residual.append(args[0]))
    with torch.inference_mode():
        hidden = model.backbone(model.embed(frames), torch.arange(48)[None], torch.tensor([0]))
        logits = model.candidate_logits(hidden)
    hook.remove()
    rms = residual[0].pow(2).mean(-1).sqrt()
    assert (rms > 0.3).all() and (rms < 10).all()  # the residual stream neither vanishes nor explodes
    assert 0.3 < logits.std() < 3.0
    assert logits.softmax(-1).max() < 0.5  # no candidate dominates: sampling draws varied tokens

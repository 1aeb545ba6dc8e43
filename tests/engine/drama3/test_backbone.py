"""The backbone against Hugging Face transformers' Qwen3.5-MoE, and against itself across phases.

The reference is `transformers.models.qwen3_5_moe` loaded with the tiny checkpoint's own
tensors (original key names, FP8 experts dequantised here and fused into its expert
stacks), fed the same input embeddings. Our side runs through the real loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

HF_TEXT_FIELDS = (
    "hidden_size", "num_hidden_layers", "layer_types", "vocab_size", "rms_norm_eps", "max_position_embeddings",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
)
PROMPT_ROWS = 80  # more than one 64-row DeltaNet chunk, not a multiple of it
DECODE_STEPS = 6


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(path / shard, framework="pt") as reader:
            tensors.update({key: reader.get_tensor(key) for key in reader.keys()})
    return tensors


def dequantized(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Block FP8: every 128x128 block of `weight` times its scale."""
    return weight.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint: Path):
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    text = json.loads((tiny_checkpoint / "config.json").read_text())["text_config"]
    config = Qwen3_5MoeTextConfig(**{name: text[name] for name in HF_TEXT_FIELDS})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(config).float().eval()
    tensors = checkpoint_tensors(tiny_checkpoint)
    state = {"lm_head.weight": tensors["lm_head.weight"].float()}
    for key, value in tensors.items():
        if key.startswith("model.language_model.") and ".mlp.experts." not in key:
            state["model." + key.removeprefix("model.language_model.")] = value.float()
    prefix = "model.language_model.layers.{}.mlp.experts.{}.{}_proj."
    for layer in range(text["num_hidden_layers"]):
        def expert(e: int, projection: str) -> torch.Tensor:
            key = prefix.format(layer, e, projection)  # noqa: B023 - called within this iteration only
            return dequantized(tensors[key + "weight"], tensors[key + "weight_scale_inv"])

        experts = range(text["num_experts"])
        state[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat((expert(e, "gate"), expert(e, "up"))) for e in experts])
        state[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack([expert(e, "down") for e in experts])
    model.load_state_dict(state, strict=True)
    return model


def prompt_frames(config, rows: int, seed: int) -> torch.Tensor:
    """Text rows, then audio rows [c0 + semantic_start, c0..c9]: int64 [1, rows, 11]."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.zeros(1, rows, 11, dtype=torch.long)
    text = rows // 3
    frames[0, :text, 0] = torch.randint(0, 256, (text,), generator=generator)
    frames[0, text:, 1] = torch.randint(0, 4096, (rows - text,), generator=generator)
    frames[0, text:, 2:] = torch.randint(0, 1024, (rows - text, 9), generator=generator)
    frames[0, text:, 0] = frames[0, text:, 1] + config.semantic_start_token_id
    return frames


def run(model, frames: torch.Tensor, start: int, slot: int, kv_len: int | None = None) -> torch.Tensor:
    rows = frames.shape[1]
    positions = torch.arange(start, start + rows)[None]
    with torch.inference_mode():
        return model.backbone(model.embed(frames), positions, torch.tensor([slot]), kv_len)


def test_prefill_and_decode_match_transformers(tiny_model, hf_model) -> None:
    model, config, _ = tiny_model
    model.setup_caches(3, 128, "cpu", torch.float32)
    frames = prompt_frames(config, PROMPT_ROWS + DECODE_STEPS, seed=1)
    with torch.inference_mode():
        embeds = model.embed(frames)
        ours = [run(model, frames[:, :PROMPT_ROWS], 0, slot=2)]
        reference = hf_model.model(inputs_embeds=embeds[:, :PROMPT_ROWS], use_cache=True)
        cache, theirs = reference.past_key_values, [reference.last_hidden_state]
        for step in range(PROMPT_ROWS, PROMPT_ROWS + DECODE_STEPS):
            ours.append(run(model, frames[:, step:step + 1], step, slot=2))
            reference = hf_model.model(inputs_embeds=embeds[:, step:step + 1], past_key_values=cache, use_cache=True)
            theirs.append(reference.last_hidden_state)
        ours, theirs = torch.cat(ours, 1), torch.cat(theirs, 1)
        hf_logits = hf_model.lm_head(theirs)[..., model.candidate_ids]
        logits = model.candidate_logits(ours)
    assert ours.shape == (1, PROMPT_ROWS + DECODE_STEPS, config.text.hidden_size)
    assert ours.std() > 0.5  # the final norm gives unit-scale rows
    torch.testing.assert_close(ours, theirs, atol=5e-5, rtol=1e-5)
    assert logits.shape[-1] == 4097 and logits.dtype == torch.float32
    torch.testing.assert_close(logits, hf_logits, atol=5e-5, rtol=1e-5)


def test_candidate_rows_are_eos_and_the_band(tiny_model, tiny_checkpoint: Path) -> None:
    model, config, tokenizer = tiny_model
    ids = model.candidate_ids
    assert ids.tolist() == sorted([config.eos_token_id, *range(config.semantic_start_token_id,
                                                                config.semantic_end_token_id + 1)])
    assert tokenizer.id_to_token(int(ids[0])) == "<|im_end|>"  # the tiny vocabulary puts EOS below the band
    with safe_open(tiny_checkpoint / "model-00002-of-00002.safetensors", framework="pt") as reader:
        head = reader.get_tensor("lm_head.weight").float()
    torch.testing.assert_close(model.candidate_head, head[ids], atol=0, rtol=0)


def test_chunked_prefill_equals_one_shot(tiny_model) -> None:
    model, config, _ = tiny_model
    model.setup_caches(2, 128, "cpu", torch.float32)
    frames = prompt_frames(config, PROMPT_ROWS, seed=2)
    whole = run(model, frames, 0, slot=0)
    chunks = [run(model, frames[:, a:b], a, slot=1) for a, b in ((0, 13), (13, 50), (50, 51), (51, PROMPT_ROWS))]
    torch.testing.assert_close(torch.cat(chunks, 1), whole, atol=2e-5, rtol=1e-5)


def test_decode_after_prefill_equals_longer_prefill(tiny_model) -> None:
    model, config, _ = tiny_model
    model.setup_caches(2, 128, "cpu", torch.float32)
    frames = prompt_frames(config, PROMPT_ROWS, seed=3)
    whole = run(model, frames, 0, slot=0)
    prefix = PROMPT_ROWS - DECODE_STEPS
    steps = [run(model, frames[:, :prefix], 0, slot=1)]
    steps += [run(model, frames[:, p:p + 1], p, slot=1, kv_len=96) for p in range(prefix, PROMPT_ROWS)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=2e-5, rtol=1e-5)


def test_batched_slots_equal_single_runs_and_slots_are_reused(tiny_model) -> None:
    model, config, _ = tiny_model
    model.setup_caches(4, 64, "cpu", torch.float32)
    a, b = prompt_frames(config, 40, seed=4), prompt_frames(config, 40, seed=5)
    # A take in slot 3 first, so slot 3 holds stale KV and DeltaNet state when b starts there.
    run(model, a, 0, slot=3)
    single = [run(model, a, 0, slot=0), run(model, b, 0, slot=1)]
    with torch.inference_mode():
        both = model.backbone(model.embed(torch.cat((a, b))), torch.arange(40).expand(2, 40), torch.tensor([2, 3]))
        step = torch.cat((a[:, :1], b[:, :1]))  # one decode row per slot, at position 40
        decoded = model.backbone(model.embed(step), torch.tensor([[40], [40]]), torch.tensor([2, 3]))
    torch.testing.assert_close(both, torch.cat(single), atol=2e-5, rtol=1e-5)
    for slot, frames, row in ((0, a, 0), (1, b, 1)):
        alone = run(model, frames[:, :1], 40, slot=slot)
        torch.testing.assert_close(decoded[row:row + 1], alone, atol=2e-5, rtol=1e-5)

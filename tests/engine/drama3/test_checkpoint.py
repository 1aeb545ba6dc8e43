"""Loading: refusals that name what is wrong, checkpoint resolution, progress."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.checkpoints import resolve_checkpoint
from engine.drama3.checkpoint import HUB_PATTERNS, load_model
from engine.drama3.tiny import demo_checkpoint
from engine.errors import CheckpointError, RequestError

BACKBONE_SHARD = "model-00001-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def copy_of(checkpoint: Path, target: Path) -> Path:
    """The checkpoint as links, so a test can replace single files cheaply."""
    target.mkdir()
    for file in checkpoint.iterdir():
        (target / file.name).symlink_to(file)
    return target


def edit_shard(path: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Rewrite the backbone shard (and the index) after `change` edits its tensors."""
    with safe_open(path / BACKBONE_SHARD, framework="pt") as reader:
        tensors = {key: reader.get_tensor(key) for key in reader.keys()}
    change(tensors)
    (path / BACKBONE_SHARD).unlink()
    save_file(tensors, path / BACKBONE_SHARD)
    index = json.loads((path / INDEX).read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != BACKBONE_SHARD}
    index["weight_map"].update({key: BACKBONE_SHARD for key in tensors})
    (path / INDEX).unlink()
    (path / INDEX).write_text(json.dumps(index))


def edit_config(path: Path, change: Callable[[dict], None]) -> None:
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").unlink()
    (path / "config.json").write_text(json.dumps(config))


def refusal(path: Path) -> str:
    with pytest.raises(CheckpointError) as error:
        load_model(path)
    assert isinstance(error.value, RequestError)  # the CLI prints it as one line
    return str(error.value)


def test_missing_tensor_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    edit_shard(path, lambda t: t.pop("model.language_model.layers.1.linear_attn.A_log"))
    message = refusal(path)
    assert "lacks" in message and "model.language_model.layers.1.linear_attn.A_log" in message


def test_unexpected_tensor_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    edit_shard(path, lambda t: t.update({"model.language_model.layers.0.mlp.router_bias": torch.zeros(8)}))
    message = refusal(path)
    assert "unexpected" in message and "model.language_model.layers.0.mlp.router_bias" in message


def test_wrong_shape_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    key = "model.language_model.layers.3.self_attn.q_norm.weight"
    edit_shard(path, lambda t: t.update({key: torch.zeros(32, dtype=torch.bfloat16)}))
    message = refusal(path)
    assert key in message and "[32]" in message and "[64]" in message


def test_experts_must_stay_fp8(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    key = "model.language_model.layers.2.mlp.experts.5.up_proj.weight"
    edit_shard(path, lambda t: t.update({key: t[key].to(torch.bfloat16)}))
    message = refusal(path)
    assert key in message and "float8_e4m3fn" in message


@pytest.mark.parametrize(("change", "field"), [
    (lambda c: c["text_config"].update(num_experts_per_tok=0), "text_config.num_experts_per_tok"),
    (lambda c: c["text_config"].update(layernorm_zero_centered_gamma=False),
     "text_config.layernorm_zero_centered_gamma"),
    (lambda c: c["audio_decoder_config"].update(dim=96), "audio_decoder_config.dim"),
    (lambda c: c["quantization_config"].update(weight_block_size=[64, 64]), "quantization_config.weight_block_size"),
])
def test_bad_config_value_is_named(tiny_checkpoint: Path, tmp_path: Path, change, field: str) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    edit_config(path, change)
    message = refusal(path)
    assert field in message and "config.json" in message


def test_config_sizes_must_match_the_tensors(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    edit_config(path, lambda c: c["audio_decoder_config"].update(intermediate_size=128))
    message = refusal(path)
    assert ".transformer_layer.feed_forward.w1.weight has shape [256, 128]" in message and "[128, 128]" in message


def test_missing_shard_and_tokenizer_mismatch_are_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt")
    (path / "model-00002-of-00002.safetensors").unlink()
    assert "model-00002-of-00002.safetensors" in refusal(path)
    path = copy_of(tiny_checkpoint, tmp_path / "ckpt2")
    edit_config(path, lambda c: c.update(eos_token_id=c["eos_token_id"] + 1))
    assert "<|im_end|>" in refusal(path)


def test_progress_reports_each_shard(tiny_checkpoint: Path) -> None:
    calls = []
    load_model(tiny_checkpoint, progress=lambda *a: calls.append(a))
    total = sum(f.stat().st_size for f in tiny_checkpoint.glob("*.safetensors"))
    assert [c[:2] for c in calls] == [(1, 2), (2, 2)]
    assert calls[-1][2:] == (total, total) and calls[0][2] < total


def test_resolve_a_directory(tiny_checkpoint: Path, tmp_path: Path) -> None:
    assert resolve_checkpoint(tiny_checkpoint, HUB_PATTERNS) == tiny_checkpoint
    assert resolve_checkpoint(str(tiny_checkpoint), HUB_PATTERNS) == tiny_checkpoint
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        resolve_checkpoint(tmp_path, HUB_PATTERNS)
    with pytest.raises(CheckpointError, match="neither a checkpoint directory nor"):
        resolve_checkpoint(tmp_path / "absent", HUB_PATTERNS)


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_resolve_from_the_hugging_face_cache(tiny_checkpoint: Path, hub_cache: Path) -> None:
    revision = "e0a9218aa48888270f06ef1ed9ea67622c0e17d2"
    repo = hub_cache / "models--fishaudio--drama-3"
    (repo / "snapshots").mkdir(parents=True)
    copy_of(tiny_checkpoint, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    path = resolve_checkpoint("fishaudio/drama-3", HUB_PATTERNS)
    assert path == repo / "snapshots" / revision
    assert resolve_checkpoint(f"fishaudio/drama-3@{revision}", HUB_PATTERNS) == path
    _, config, _ = load_model("fishaudio/drama-3")
    assert config.text.hidden_size == 128


def test_offline_and_absent_is_a_clear_error(hub_cache: Path) -> None:
    started = time.monotonic()
    with pytest.raises(CheckpointError) as error:
        resolve_checkpoint("fishaudio/drama-3", HUB_PATTERNS)
    assert time.monotonic() - started < 5  # no network wait
    assert "fishaudio/drama-3" in str(error.value) and "HF_HUB_OFFLINE" in str(error.value)


def test_none_is_the_tiny_demo_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = demo_checkpoint()
    assert path == tmp_path / "cache" / "retake" / "drama3-tiny"
    shard = path / BACKBONE_SHARD
    written = shard.stat().st_mtime_ns
    assert demo_checkpoint() == path and shard.stat().st_mtime_ns == written
    assert [p.name for p in path.parent.iterdir()] == ["drama3-tiny"]  # no staging directory left behind
    shutil.rmtree(path)

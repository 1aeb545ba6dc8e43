"""The tiny checkpoint: released layout, deterministic, and key tables that describe the release."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from backend.cli import main
from engine.personaplex.checkpoint import expand_depformer, lm_shapes, mimi_shapes, read_config
from engine.personaplex.config import RELEASED_MIMI, PersonaPlexConfig
from engine.personaplex.tiny import LM, MIMI, random_state

FILES = ["config.json", "mimi_config.json", "model.safetensors", "tokenizer-e351c8d8-checkpoint125.safetensors",
         "tokenizer_spm_32k_3.model", "voices/NATF2.pt"]


def test_make_checkpoint_writes_the_released_layout_deterministically(personaplex_checkpoint: Path, tmp_path: Path,
                                                                      capsys):
    assert main(["make-checkpoint", "personaplex-tiny", str(tmp_path / "again"), "--seed", "0"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert sorted(written["files"]) == sorted(FILES)
    for name in FILES:  # the same seed writes the same bytes
        assert (tmp_path / "again" / name).read_bytes() == (personaplex_checkpoint / name).read_bytes(), name
    raw = json.loads((personaplex_checkpoint / "config.json").read_text())
    assert raw["demo_weights"] is True and raw["dep_q"] == 8 and raw["n_q"] == 16
    cfg = read_config(personaplex_checkpoint)
    assert cfg.lm.depformer_steps == 16 and cfg.lm.ring_columns == 4 and cfg.mimi.frame_size == 1920
    assert max(cfg.lm.silence_tokens + cfg.lm.sine_tokens) < cfg.lm.card


def test_random_state_depends_on_the_seed():
    shapes = {"a.weight": (4, 3), "b.alpha": (1, 1, 3)}
    one = random_state(shapes, torch.Generator().manual_seed(0))
    assert torch.equal(one["a.weight"], random_state(shapes, torch.Generator().manual_seed(0))["a.weight"])
    assert not torch.equal(one["a.weight"], random_state(shapes, torch.Generator().manual_seed(1))["a.weight"])
    assert torch.equal(one["b.alpha"], torch.ones(1, 1, 3))


def test_released_tables_match_the_documented_model():
    cfg = PersonaPlexConfig.from_dicts({}, None)  # an empty config.json: the release
    assert (cfg.lm.dim, cfg.lm.ffn_hidden, cfg.lm.depformer_ffn_hidden, cfg.lm.context) == (4096, 11264, 2816, 3000)
    params = sum(math.prod(s) for s in lm_shapes(cfg.lm).values())
    assert 7.4e9 < params < 7.8e9  # "about 7.6B" (reference/personaplex.md §1.1)
    mimi = mimi_shapes(cfg.mimi)
    assert sum(k.startswith("encoder_transformer.") for k in mimi) == 80  # 8 layers x 10 tensors
    assert mimi["upsample.convtr.convtr.convtr.weight"] == (512, 1, 4)  # channel-wise
    assert "decoder.model.14.conv.conv.weight" in mimi and "encoder.model.14.conv.conv.weight" in mimi
    assert cfg.mimi.frame_size == 1920 and cfg.mimi.downsample == 2 and RELEASED_MIMI["quantizer"]["n_q"] == 32


def test_depformer_expansion_tiles_and_copies_eight_sets_to_sixteen():
    cfg = PersonaPlexConfig.from_dicts({**LM, "text_card": 50, "silence_tokens": [0] * 8, "sine_tokens": [0] * 8},
                                       MIMI).lm
    stored = random_state(lm_shapes(cfg), torch.Generator().manual_seed(0))
    full = expand_depformer(stored, cfg)
    w = full["depformer.layers.1.self_attn.in_proj_weight"].view(16, 3 * 32, 32)
    assert torch.equal(w[11], stored["depformer.layers.1.self_attn.in_proj_weight"].view(8, 96, 32)[3])
    assert torch.equal(full["linears.15.weight"], stored["linears.7.weight"])
    assert torch.equal(full["depformer.layers.0.gating.9.linear_out.weight"],
                       stored["depformer.layers.0.gating.1.linear_out.weight"])
    assert torch.equal(full["depformer_emb.14.weight"], stored["depformer_emb.6.weight"])
    assert torch.equal(full["depformer_emb.7.weight"], stored["depformer_emb.7.weight"])
    assert "depformer_emb.15.weight" not in full  # the last codebook is never a depformer input


def test_a_repo_id_resolves_from_the_local_hugging_face_cache(personaplex_checkpoint: Path, tmp_path: Path,
                                                              monkeypatch):
    import shutil

    import huggingface_hub.constants

    from engine.checkpoints import resolve_checkpoint
    from engine.personaplex.checkpoint import HUB_PATTERNS

    repo = tmp_path / "hub" / "models--nvidia--personaplex-7b-v1"
    shutil.copytree(personaplex_checkpoint, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network
    root = resolve_checkpoint("nvidia/personaplex-7b-v1", HUB_PATTERNS)
    assert root == repo / "snapshots" / "abc123" and read_config(root).demo_weights


def test_no_checkpoint_means_the_tiny_demo_written_once_to_the_cache(tmp_path: Path, monkeypatch):
    from engine.personaplex.engine import PersonaPlex

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = PersonaPlex.load(None, device="cpu")
    root = tmp_path / "retake" / "personaplex-tiny"
    assert engine.root == root and engine.demo_weights and engine.voice_names() == ["NATF2"]
    written = (root / "model.safetensors").stat().st_mtime_ns
    assert PersonaPlex.load(None, device="cpu").root == root
    assert (root / "model.safetensors").stat().st_mtime_ns == written
    assert not [p for p in tmp_path.joinpath("retake").iterdir() if p.name.startswith(".")]  # no staging left

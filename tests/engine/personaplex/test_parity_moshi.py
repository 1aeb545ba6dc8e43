"""Our PersonaPlex numerics against Kyutai's `moshi==0.2.13` on the same tiny weights.

moshi is built from the checkpoint files only: `LMModel` from config.json with dep_q = 16
and the stored 8 depformer sets expanded the way PersonaPlex's `get_moshi_lm` does (tile the
per-step attention weights, copy sets 8..15 from 0..7 by name), and Mimi through moshi's own
`get_mimi` (a strict load, so our key layout is checked too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # moshi would torch.compile its RMSNorm on first use


def moshi_lm(root: Path):
    from moshi.models.lm import LMModel
    from safetensors.torch import load_file

    raw = json.loads((root / "config.json").read_text())
    kwargs = {k: v for k, v in raw.items() if k not in ("silence_tokens", "sine_tokens", "mimi_config_name",
                                                          "demo_weights", "depformer_causal")}
    kwargs["dep_q"] = 16  # PersonaPlex's get_moshi_lm
    lm = LMModel(device="cpu", dtype=torch.float32, **kwargs)
    state = load_file(str(root / "model.safetensors"))
    for name, tensor in list(state.items()):  # Patch 1: tile the per-step attention weights 8 -> 16
        if name.startswith("depformer.") and ".self_attn." in name:
            state[name] = torch.cat([tensor, tensor], dim=0)
    for name in lm.state_dict():  # Patch 2: sets 8..15 from 0..7
        for old, new in zip(range(8), range(8, 16)):
            for group in ("gating", "linears", "depformer_in", "depformer_emb"):
                source = name.replace(f"{group}.{new}.", f"{group}.{old}.")
                if f"{group}.{new}." in name and name not in state and source in state:
                    state[name] = state[source]
    lm.load_state_dict(state, strict=True)
    return lm.eval()


@pytest.fixture(scope="module")
def models(personaplex_checkpoint: Path):
    from engine.personaplex.checkpoint import load_lm, read_config

    cfg = read_config(personaplex_checkpoint)
    temporal, depformer = load_lm(personaplex_checkpoint, cfg, torch.device("cpu"), torch.float32)
    return cfg, temporal, depformer, moshi_lm(personaplex_checkpoint)


def random_tokens(cfg, batch: int, steps: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.lm.card + 1, (batch, cfg.lm.rows, steps), generator=g)
    tokens[:, 0] = torch.randint(0, cfg.lm.text_card + 1, (batch, steps), generator=g)
    tokens[0, 5, steps // 2] = -1  # "no input": a zero embedding
    tokens[1, 0, steps - 1] = -1
    return tokens


@torch.no_grad()
def test_temporal_hidden_and_text_logits_match_moshi_past_the_context(models):
    cfg, temporal, _, lm = models
    B, steps = 2, cfg.lm.context + 30  # the key/value ring wraps
    tokens = random_tokens(cfg, B, steps, seed=1)
    temporal.setup_streams(B)
    worst = 0.0
    with lm.streaming(B):
        for t in range(steps):
            ref_hidden, ref_logits = lm.forward_text(tokens[:, :, t:t + 1])
            hidden, logits = temporal(temporal.embed(tokens[:, :, t]), torch.full((B, 1), t))
            assert logits.shape == (B, 1, cfg.lm.text_card)
            worst = max(worst, (logits - ref_logits[:, 0]).abs().max().item(), (hidden - ref_hidden).abs().max().item())
    assert worst < 1e-4, worst


@torch.no_grad()
def test_depformer_greedy_codes_match_moshi(models):
    from moshi.models.lm import LMGen

    cfg, temporal, depformer, lm = models
    B = 3
    gen = LMGen(lm, use_sampling=False)
    tokens = random_tokens(cfg, B, 6, seed=2)
    temporal.setup_streams(B)
    depformer.setup_streams(B)
    none = torch.zeros(B, cfg.lm.depformer_steps, dtype=torch.bool)
    for t in range(6):
        hidden, _ = temporal(temporal.embed(tokens[:, :, t]), torch.full((B, 1), t))
        text = torch.randint(0, cfg.lm.text_card, (B,), generator=torch.Generator().manual_seed(t))
        ours = depformer(hidden, text, none.long(), none, lambda logits, _: logits.argmax(-1))
        assert torch.equal(ours, gen.depformer_step(text, hidden))


@torch.no_grad()
def test_teacher_forced_depformer_logits_match_moshi_training_pass(models):
    cfg, temporal, depformer, lm = models
    B, S = 2, cfg.lm.depformer_steps
    tokens = random_tokens(cfg, B, 1, seed=3)
    temporal.setup_streams(B)
    depformer.setup_streams(B)
    hidden, _ = temporal(temporal.embed(tokens[:, :, 0]), torch.zeros(B, 1, dtype=torch.long))
    g = torch.Generator().manual_seed(4)
    text = torch.randint(0, cfg.lm.text_card, (B,), generator=g)
    targets = torch.randint(0, cfg.lm.card, (B, S), generator=g)
    seen = []

    def record(logits: torch.Tensor, _: int) -> torch.Tensor:
        seen.append(logits)
        return logits.argmax(-1)

    depformer(hidden, text, targets, torch.ones(B, S, dtype=torch.bool), record)
    sequence = torch.cat([text[:, None], targets], dim=1)[:, :, None]  # [B, K, 1]: step t reads token t
    reference = lm.forward_depformer_training(sequence, hidden)  # [B, S, 1, card]
    assert torch.allclose(torch.stack(seen, dim=1), reference[:, :, 0], atol=1e-4)


def moshi_mimi(root: Path):
    from moshi.models.loaders import get_mimi

    mimi_config = json.loads((root / "mimi_config.json").read_text())
    return get_mimi(root / "tokenizer-e351c8d8-checkpoint125.safetensors", mimi_config, num_codebooks=8)


@torch.no_grad()
def test_mimi_streaming_encode_decode_match_moshi_with_a_row_reset(personaplex_checkpoint: Path):
    from engine.personaplex.checkpoint import load_mimi, read_config

    cfg = read_config(personaplex_checkpoint)
    ours = load_mimi(personaplex_checkpoint, cfg, torch.device("cpu"))
    ref = moshi_mimi(personaplex_checkpoint)
    B, frames, n = 2, 12, cfg.mimi.frame_size  # 24 transformer positions: its 8-position ring wraps
    pcm = torch.randn(B, frames * n, generator=torch.Generator().manual_seed(5)) * 0.3
    ours.setup_streams(B)
    worst = 0.0
    with ref.streaming(B):
        for f in range(frames):
            if f == 7:  # row 1 starts a new stream mid-way
                ours.reset_streams(torch.tensor([False, True]))
                ref.reset_streaming(torch.tensor([False, True]))
            x = pcm[:, f * n:(f + 1) * n]
            ref_codes = ref.encode(x[:, None])[:, :, 0]
            assert torch.equal(ours.encode(x), ref_codes), f
            worst = max(worst, (ours.decode(ref_codes) - ref.decode(ref_codes[:, :, None])[:, 0]).abs().max().item())
    assert worst < 1e-5, worst

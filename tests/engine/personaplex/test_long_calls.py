"""Calls of any length: the key/value rings wrap, tick after tick, exactly as Kyutai's moshi streams.

The tiny checkpoint gets a context of 8 frames (Mimi's transformers already have 8
positions, 4 frames), so a call of 150 ticks wraps Helium's ring 18 times and Mimi's 37.
References: moshi 0.2.13's own streaming (Mimi + `LMGen`, built from the same files), a
full recompute of Helium over the whole call with a sliding-window mask, and the same
call an hour later (positions past 45,000), which RoPE makes equal.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import torch

from engine.personaplex.engine import PersonaPlex
from engine.personaplex.mimi import MimiTransformer
from engine.personaplex.ring import ring_step
from engine.personaplex.sampling import Sampling

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # moshi would torch.compile its RMSNorm on first use
CONTEXT = 8
HOUR = 45_000  # frames in an hour (12.5 a second)


def short_context_engine(root: Path) -> PersonaPlex:
    from engine.personaplex.checkpoint import load_lm, load_mimi, load_tokenizer, read_config

    cfg = read_config(root)
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, context=CONTEXT))
    temporal, depformer = load_lm(root, cfg, torch.device("cpu"), torch.float32)
    return PersonaPlex.build(root, cfg, temporal, depformer, load_mimi(root, cfg, torch.device("cpu")),
                             load_tokenizer(root, cfg), torch.device("cpu"), 1, Sampling(greedy=True))


def moshi_models(root: Path):  # type: ignore[no-untyped-def]
    """moshi's LMGen (the agent's 8 depformer steps, as moshi runs a Moshi) and Mimi, from the same files."""
    from moshi.models.lm import LMGen, LMModel
    from moshi.models.loaders import get_mimi
    from safetensors.torch import load_file

    raw = json.loads((root / "config.json").read_text())
    kwargs = {k: v for k, v in raw.items() if k not in ("silence_tokens", "sine_tokens", "mimi_config_name",
                                                          "demo_weights", "depformer_causal")}
    lm = LMModel(device="cpu", dtype=torch.float32, **{**kwargs, "context": CONTEXT})
    state = load_file(str(root / "model.safetensors"))
    del state[f"depformer_emb.{lm.dep_q - 1}.weight"]  # the input of step 8, the user's first codebook: unused
    lm.load_state_dict(state, strict=True)
    mimi = get_mimi(root / "tokenizer-e351c8d8-checkpoint125.safetensors",
                    json.loads((root / "mimi_config.json").read_text()), num_codebooks=8)
    return LMGen(lm.eval(), use_sampling=False), mimi


def user_call(ticks: int, seed: int = 0) -> np.ndarray:
    """[ticks, 1920] float32: a wobbling voice with noise."""
    t = np.arange(ticks * 1920) / 24000
    noise = np.random.default_rng(seed).normal(0, 0.05, t.shape)
    return (0.3 * np.sin(2 * np.pi * (180 + 40 * np.sin(3 * t)) * t) + noise).astype(np.float32).reshape(ticks, 1920)


@torch.no_grad()
def test_a_long_call_streams_exactly_as_moshi_while_every_ring_wraps(personaplex_checkpoint: Path):
    ticks = 150
    engine = short_context_engine(personaplex_checkpoint)
    gen, mimi = moshi_models(personaplex_checkpoint)
    user = user_call(ticks + 1)
    # Slot 0 starts a bare stream, as moshi's LMGen does (no system prompt); it speaks once past warm-up.
    engine.lockstep.reset(engine.rows(0))
    engine.mimi.reset_streams(engine.rows(0))
    engine.lockstep.active[0] = True
    engine.live.add(0)
    ours = [engine.step(user[0])[0]]  # tick 0: the stream's first tick (moshi has none)
    ref_tokens, ref_pcm = [], []
    n = engine.cfg.lm.codebooks
    silence = torch.tensor(engine.cfg.lm.silence_tokens)[None, :, None]  # what our decoder gets before speaking
    with gen.streaming(1), mimi.streaming(1):
        mimi.decode(silence)  # our tick 0
        for t in range(ticks):
            out = gen.step(mimi.encode(torch.from_numpy(user[t])[None, None]))  # [1, 1 + n, 1] or None
            ref_tokens.append(None if out is None else out[0, :, 0])
            ref_pcm.append(mimi.decode(silence if out is None else out[:, 1:1 + n])[0, 0].numpy())
            if out is not None:
                engine.ticks.speaking[0] = True  # the agent speaks from moshi's first frame on
            ours.append(engine.step(user[t + 1])[0])  # ours at tick t + 1 is moshi's step t
    assert int(engine.lockstep.local[0]) - 1 > 18 * CONTEXT  # Helium's ring wrapped 18 times
    compared = 0
    for t in range(ticks):
        if ref_tokens[t] is None:
            continue
        frame = ours[t + 1]
        assert frame is not None
        assert np.array_equal(frame.tokens[:1 + n], ref_tokens[t].numpy()), t
        np.testing.assert_allclose(frame.pcm, ref_pcm[t], atol=1e-4)
        compared += 1
    assert compared == ticks - engine.cfg.lm.max_delay


@torch.no_grad()
def test_streaming_through_a_wrapping_ring_equals_a_full_recompute_with_a_sliding_window(
        personaplex_checkpoint: Path):
    engine = short_context_engine(personaplex_checkpoint)
    temporal, cfg = engine.lockstep.temporal, engine.cfg.lm
    steps = 5 * CONTEXT + 3
    x = torch.randn(2, steps, cfg.dim, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(steps).expand(2, -1)
    temporal.setup_streams(2)
    streamed = torch.cat([temporal.trunk(x[:, t:t + 1], positions[:, t:t + 1]) for t in range(steps)], dim=1)
    # The whole call at once: a ring as long as the call (nothing is overwritten), keys within the context.
    for layer in temporal.transformer.layers:
        layer.self_attn.capacity = steps
    temporal.setup_streams(2)
    step = ring_step(positions, steps, CONTEXT, cfg.dim // cfg.num_heads, cfg.max_period)
    whole = x
    for layer in temporal.transformer.layers:
        whole = layer(whole, step)
    torch.testing.assert_close(streamed, whole, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_an_hour_into_a_call_the_model_computes_what_it_did_at_its_start(personaplex_checkpoint: Path):
    """RoPE makes attention depend on position differences only: with float64 angles the same inputs
    an hour in give the same hidden states (float32 angles drift by ~1e-3 rad there). A stream that
    begins at a late position sees its ring's unwritten slots as history, so the first
    layers x context positions differ; from there on every window holds only this run's keys."""
    engine = short_context_engine(personaplex_checkpoint)
    temporal, cfg = engine.lockstep.temporal, engine.cfg.lm
    clean = cfg.num_layers * CONTEXT
    x = torch.randn(1, clean + 2 * CONTEXT, cfg.dim, generator=torch.Generator().manual_seed(2))
    runs = []
    for start in (0, HOUR):
        temporal.setup_streams(1)
        runs.append(torch.cat([temporal.trunk(x[:, t:t + 1], torch.tensor([[start + t]]))
                               for t in range(x.shape[1])], dim=1)[:, clean:])
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=2e-5)
    transformer = next(m for m in engine.mimi.modules() if isinstance(m, MimiTransformer))
    clean = len(transformer.layers) * transformer.context
    latents = torch.randn(1, engine.cfg.mimi.dimension, clean + 16, generator=torch.Generator().manual_seed(3))
    runs = []
    for start in (0, 2 * HOUR):  # two positions a frame
        transformer.setup_streams(1)
        transformer.offset.fill_(start)
        runs.append(torch.cat([transformer(latents[..., t:t + 2]) for t in range(0, latents.shape[-1], 2)],
                              -1)[..., clean:])
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=2e-5)


@torch.no_grad()
def test_a_slot_recycled_after_an_hour_long_call_equals_a_fresh_engine(personaplex_checkpoint: Path):
    """Nothing of a call an hour long (positions past 45,000, every ring wrapped) reaches the next one."""
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=Sampling(greedy=True))
    engine.open(persona="Hello")
    user = user_call(12, seed=3)
    for frame in user[:4]:
        engine.step(np.stack([frame, frame]))
    engine.lockstep.local += HOUR  # an hour later (a whole number of staging-ring turns)
    for frame in user[4:8]:
        engine.step(np.stack([frame, frame]))
    engine.start(0, persona="Your name is Jane.", voice="NATF2")
    recycled = [engine.step(np.stack([frame, frame]))[0] for frame in user]
    fresh = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=Sampling(greedy=True))
    fresh.open(persona="Your name is Jane.", voice="NATF2")
    for a, b in zip(recycled, (fresh.step(frame)[0] for frame in user)):
        assert a is not None and b is not None
        assert np.array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-5)

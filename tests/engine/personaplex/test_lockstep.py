"""The lockstep semantics of the seed on the tiny model: delays and de-delay, the model input,
warm-up gates and the silence sanitising before decode, and the system prompt's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.config import PAD_TOKEN
from engine.personaplex.engine import PersonaPlex
from engine.personaplex.sampling import Sampling


@pytest.fixture(scope="module")
def engine(personaplex_checkpoint: Path) -> PersonaPlex:
    return PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=Sampling(greedy=True))


def user_codes(engine: PersonaPlex, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.cfg.lm.card, (engine.slots, engine.cfg.lm.codebooks), generator=g)


@torch.no_grad()
def test_output_frame_is_de_delayed_and_model_input_is_the_delayed_frame(engine: PersonaPlex):
    engine.open(persona="Hello", voice=None)
    lockstep, n = engine.lockstep, engine.cfg.lm.codebooks
    texts, audios, users, outs = [], [], [], []

    def sample_text(logits: torch.Tensor) -> torch.Tensor:
        texts.append(logits.argmax(-1))
        return texts[-1]

    def sample_audio(logits: torch.Tensor) -> torch.Tensor:
        audios[-1].append(logits.argmax(-1))
        return audios[-1][-1]

    lockstep.set_samplers(sample_text, sample_audio, None)
    for tick in range(8):
        audios.append([])
        users.append(user_codes(engine, tick))
        outs.append(lockstep.tick(users[-1], [None, None]))
        audios[-1] = torch.stack(audios[-1], dim=1)  # [B, 8]: the agent codebooks
        assert outs[-1].ready == [True, True]
    engine.set_sampling(engine.sampling)
    for i in range(1, 8):
        frame = outs[i].tokens
        assert torch.equal(frame[:, 1 + n:], users[i - 1])  # the user frame of one tick earlier
        assert torch.equal(frame[:, 0], texts[i - 1])  # text: delay 0
        assert torch.equal(frame[:, 1], audios[i - 1][:, 0])  # agent codebook 0: delay 0
        assert torch.equal(frame[:, 2:1 + n], audios[i][:, 1:n])  # agent codebooks 1..7: delay 1
    for i in range(2, 8):  # what Helium saw: every stream as sampled / fed, user codebooks 1..7 one tick later
        seen = torch.cat([texts[i - 1][:, None], audios[i - 1][:, :n], users[i - 1][:, :1], users[i - 2][:, 1:]], 1)
        assert torch.equal(outs[i].embeddings, engine.lockstep.temporal.embed(seen))


@torch.no_grad()
def test_recycled_slot_warms_up_on_initial_tokens_which_are_replaced_by_silence_before_decode(
        engine: PersonaPlex, monkeypatch: pytest.MonkeyPatch):
    engine.open(persona="", voice=None)
    card = engine.cfg.lm.card
    with pytest.raises(IndexError):  # the initial token is no Mimi code: it must never reach the decoder
        engine.mimi.decode(torch.full((1, engine.cfg.lm.codebooks), card))
    seen = []
    tick = engine.lockstep.tick
    monkeypatch.setattr(engine.lockstep, "tick", lambda *a: seen.append(tick(*a)) or seen[-1])
    rng = np.random.default_rng(0)
    for _ in range(3):
        assert all(f is not None for f in engine.step(rng.uniform(-0.3, 0.3, (2, engine.frame_size))))
    engine.start(1, persona="", voice=None)
    prompt_ticks = len(engine.queues[1])
    frames = [engine.step(rng.uniform(-0.3, 0.3, (2, engine.frame_size))) for _ in range(prompt_ticks + 2)]
    sacrifice, first = seen[3], seen[4]
    assert sacrifice.ready == [True, False] and first.ready == [True, False]  # local steps 0 and 1: warm-up
    assert (sacrifice.tokens[1, 1:] == card).all()  # agent and user rows still hold the initial token
    assert all(f[0] is not None for f in frames)  # slot 0 keeps talking
    assert all(f[1] is None for f in frames[:prompt_ticks]) and all(f[1] is not None for f in frames[prompt_ticks:])


@torch.no_grad()
def test_system_prompt_order_voice_silence_persona_silence(engine: PersonaPlex):
    cfg = engine.cfg.lm
    voice = engine.voice("NATF2")
    persona = engine.tokenizer.encode("<system> You are a wise teacher. <system>")
    steps = engine.programme("You are a wise teacher.", voice)
    T, six = len(voice.embeddings), 6
    assert [s.kind for s in steps] == ["sacrifice"] + ["voice"] * T + ["tokens"] * (2 * six + len(persona))
    assert steps[1 + T].restore is not None and sum(s.restore is not None for s in steps) == 1
    assert [s.text for s in steps[1 + T:]] == [PAD_TOKEN] * six + persona + [PAD_TOKEN] * six
    assert all(s.agent == cfg.silence_tokens and s.user_sine for s in steps[1 + T:])
    # Run it: the staging ring holds the forced streams, tick after tick.
    engine.lockstep.cold_start()
    ring, CT, n = engine.lockstep.ring, cfg.ring_columns, cfg.codebooks
    written = []
    for step in steps:
        column = engine.lockstep.phys % CT
        engine.lockstep.tick(user_codes(engine, 0), [step, step])
        written.append(ring[0, :, column].clone())
    delayed = torch.tensor(cfg.delays) > 0
    for i, (step, column) in enumerate(zip(steps[1 + T:], written[1 + T:])):
        assert column[0] == step.text
        expected = torch.tensor([step.text, *cfg.silence_tokens, *cfg.sine_tokens])
        if i == 0:  # delayed rows were written before this tick: the restored voice cache holds them
            restored = torch.roll(voice.cache, engine.lockstep.phase(0), dims=-1)[:, (1 + T) % CT].cpu()
            expected = torch.where(delayed, restored, expected)
        assert torch.equal(column.cpu(), expected), i
    assert all((c[1 + n:] == cfg.card).all() for c in written[1:1 + T])  # voice ticks: dummy user tokens


def test_a_token_stepped_prompt_loses_its_first_tick_to_the_cold_start(engine: PersonaPlex):
    steps = engine.programme("", None)  # no voice: silence, silence
    assert [s.kind for s in steps] == ["sacrifice"] + ["tokens"] * 11

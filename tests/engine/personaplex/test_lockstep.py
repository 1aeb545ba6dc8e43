"""The lockstep semantics of the seed on the tiny model: delays and de-delay, the model input,
a new conversation's wait and the silence sanitising before decode, and the system prompt's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.config import PAD_TOKEN
from engine.personaplex.engine import PersonaPlex
from engine.personaplex.prompt import plan
from engine.personaplex.sampling import Sampling


@pytest.fixture(scope="module")
def engine(personaplex_checkpoint: Path) -> PersonaPlex:
    return PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=Sampling(greedy=True))


def user_codes(engine: PersonaPlex, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.cfg.lm.card, (engine.slots, engine.cfg.lm.codebooks), generator=g)


@torch.no_grad()
def test_output_frame_is_de_delayed_and_model_input_is_the_delayed_frame(engine: PersonaPlex,
                                                                        monkeypatch: pytest.MonkeyPatch):
    engine.open(persona="Hello", voice=None)
    lockstep, n = engine.lockstep, engine.cfg.lm.codebooks
    texts, audios, users, outs, seen = [], [], [], [], []
    text, audio, embed = lockstep.sampling.text, lockstep.sampling.audio, lockstep.temporal.embed
    monkeypatch.setattr(lockstep.sampling, "text", lambda *a: texts.append(text(*a)) or texts[-1])
    monkeypatch.setattr(lockstep.sampling, "audio", lambda *a: audios[-1].append(audio(*a)) or audios[-1][-1])
    monkeypatch.setattr(lockstep.temporal, "embed", lambda tokens: seen.append(embed(tokens)) or seen[-1])
    for tick in range(8):
        audios.append([])
        users.append(user_codes(engine, tick))
        lockstep.tick(users[-1], 2)
        outs.append(lockstep.tokens.clone())
        audios[-1] = torch.stack(audios[-1], dim=1)  # [B, 8]: the agent codebooks
    for i in range(1, 8):
        frame = outs[i]
        assert torch.equal(frame[:, 1 + n:], users[i - 1])  # the user frame of one tick earlier
        assert torch.equal(frame[:, 0], texts[i - 1])  # text: delay 0
        assert torch.equal(frame[:, 1], audios[i - 1][:, 0])  # agent codebook 0: delay 0
        assert torch.equal(frame[:, 2:1 + n], audios[i][:, 1:n])  # agent codebooks 1..7: delay 1
    for i in range(2, 8):  # what Helium saw: every stream as sampled / fed, user codebooks 1..7 one tick later
        heard = torch.cat([texts[i - 1][:, None], audios[i - 1][:, :n], users[i - 1][:, :1], users[i - 2][:, 1:]], 1)
        assert torch.equal(seen[i], embed(heard))


@torch.no_grad()
def test_a_new_conversation_is_silent_until_its_prompt_is_read_and_no_initial_token_is_decoded(
        engine: PersonaPlex, monkeypatch: pytest.MonkeyPatch):
    engine.open(persona="", voice=None)
    card = engine.cfg.lm.card
    with pytest.raises(IndexError):  # the initial token is no Mimi code: it must never reach the decoder
        engine.mimi.decode(torch.full((1, engine.cfg.lm.codebooks), card))
    decoded = []
    decode = engine.mimi.decode
    monkeypatch.setattr(engine.mimi, "decode",
                        lambda codes, layer: decoded.append(codes.clone()) or decode(codes, layer))
    rng = np.random.default_rng(0)
    engine.start(1, persona="", voice=None)
    assert engine.prefilling(1) and not engine.lockstep.active[1]
    frames = [engine.step(rng.uniform(-0.3, 0.3, (2, engine.frame_size))) for _ in range(3)]
    assert not engine.prefilling(1)  # one chunk: the whole prompt, read before the first tick
    assert all(f[0] is not None and f[1] is not None for f in frames)
    assert engine.lockstep.local[1] == len(engine.programme("", None)) + 3  # the planned ticks, then three
    assert all((codes < card).all() for codes in decoded)
    engine.release(1)
    frame = engine.step(rng.uniform(-0.3, 0.3, (2, engine.frame_size)))
    assert frame[0] is not None and frame[1] is None and engine.lockstep.local[1] == 0  # fresh, waiting
    assert all((codes < card).all() for codes in decoded)


def columns(engine: PersonaPlex, steps: list) -> list[torch.Tensor]:
    """The staging ring's column of every programme step, as planned (each step's column is the next
    step's model input; the last one stays in the ring)."""
    planned = plan(engine.cfg.lm, steps)
    last = planned.ring[:, (len(steps) - 1) % engine.cfg.lm.ring_columns]
    return [*planned.inputs, last]


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
    planned = plan(cfg, steps)
    assert planned.positions == len(steps) - 1 and planned.ticks == len(steps)
    assert [e is not None for e in planned.embeddings] == [True] * T + [False] * (len(steps) - 1 - T)
    written, CT, n = columns(engine, steps), cfg.ring_columns, cfg.codebooks
    delayed = torch.tensor(cfg.delays) > 0
    for i, (step, column) in enumerate(zip(steps[1 + T:], written[1 + T:])):
        assert column[0] == step.text
        expected = torch.tensor([step.text, *cfg.silence_tokens, *cfg.sine_tokens])
        if i == 0:  # delayed rows were written before this tick: the restored voice cache holds them
            expected = torch.where(delayed, voice.cache[:, (1 + T) % CT].cpu(), expected)
        assert torch.equal(column, expected), i
    assert all((c[1 + n:] == cfg.card).all() for c in written[1:T])  # voice ticks: dummy user tokens
    assert torch.equal(written[T], voice.cache[:, T % CT].cpu())  # read after the restore, as the reference does


def test_a_token_stepped_prompt_loses_its_first_tick_to_the_cold_start(engine: PersonaPlex):
    steps = engine.programme("", None)  # no voice: silence, silence
    assert [s.kind for s in steps] == ["sacrifice"] + ["tokens"] * 11


def test_voice_embeddings_go_in_as_runs_of_positions() -> None:
    """A prompt chunk copies each run of a stored voice's embeddings at once (lockstep.py `voice_runs`)."""
    from engine.personaplex.lockstep import voice_runs

    e = torch.zeros(4)
    assert voice_runs([None, e, e, e, None, None, e]) == [(1, 4), (6, 7)]
    assert voice_runs([e, e]) == [(0, 2)] and voice_runs([None, None]) == [] and voice_runs([]) == []

"""System prompts read once (engine/personaplex/read_prompts.py): a conversation started with a
persona and voice read before listens at once, and is, bit for bit, the conversation started
by reading the prompt; another persona or voice is read; the least recently used is dropped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.personaplex.engine import Frame, PersonaPlex
from engine.personaplex.sampling import Sampling

PERSONA = "You are a lighthouse keeper who answers in riddles."


def engine(checkpoint: Path) -> PersonaPlex:
    return PersonaPlex.load(checkpoint, device="cpu", slots=2, sampling=Sampling(seed=4))


def talk(engine: PersonaPlex, slot: int, user: np.ndarray) -> list[Frame]:
    """The slot's frames for each of the user's frames (the other slot left out of the ticks)."""
    while engine.prefilling(slot):  # its prompt read a chunk a tick, nobody moved (as the server does)
        engine.step(np.zeros((engine.slots, engine.frame_size), np.float32), set())
    out = []
    for frame in user:
        batch = np.zeros((engine.slots, engine.frame_size), np.float32)
        batch[slot] = frame
        heard = engine.step(batch, {slot})[slot]
        assert heard is not None
        out.append(heard)
    return out


@torch.no_grad()
def test_a_prompt_read_before_is_copied_in_and_the_conversation_is_the_same(personaplex_checkpoint: Path):
    user = np.random.default_rng(1).uniform(-0.5, 0.5, (6, 1920)).astype(np.float32)
    served = engine(personaplex_checkpoint)
    served.start(1, PERSONA, "NATF2", seed=9)  # read, a chunk a tick, then kept
    talk(served, 1, user[:2])
    assert served.read_prompts.misses == 1 and len(served.read_prompts.kept) == 1
    served.release(1)
    served.start(0, PERSONA, "NATF2", seed=9)  # the same prompt, another slot: copied in
    assert served.read_prompts.hits == 1 and not served.prefilling(0)  # it listens at once
    copied = talk(served, 0, user)

    fresh = engine(personaplex_checkpoint)
    fresh.start(0, PERSONA, "NATF2", seed=9)
    assert fresh.prefilling(0)
    read = talk(fresh, 0, user)
    for a, b in zip(copied, read, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and a.text == b.text
        assert np.array_equal(a.pcm, b.pcm)


@torch.no_grad()
def test_conversations_opened_together_read_their_shared_prompt_once(personaplex_checkpoint: Path):
    """Three slots started at once with one persona (none read before): the first reads it a chunk a
    tick, the others wait, then are copied in at the next tick, each the conversation it would be
    had it read the prompt itself."""
    user = np.random.default_rng(2).uniform(-0.5, 0.5, (4, 1920)).astype(np.float32)
    served = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=3, sampling=Sampling(seed=4))
    for slot in range(3):
        served.start(slot, PERSONA, "NATF2", seed=9)
    assert served.read_prompts.misses == 3 and all(served.prefilling(slot) for slot in range(3))
    ticks = 0
    while served.prefilling(0):
        served.step(np.zeros((3, served.frame_size), np.float32), set())
        ticks += 1
    assert served.prefilling(1) and served.prefilling(2)  # queued behind slot 0's reading
    served.step(np.zeros((3, served.frame_size), np.float32), set())
    assert not served.prefilling(1) and not served.prefilling(2)  # copied in at the next tick
    assert served.read_prompts.hits == 2 and len(served.read_prompts.kept) == 1
    copied = talk(served, 2, user)

    fresh = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=3, sampling=Sampling(seed=4))
    fresh.start(2, PERSONA, "NATF2", seed=9)
    read = talk(fresh, 2, user)
    for a, b in zip(copied, read, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and a.text == b.text
        assert np.array_equal(a.pcm, b.pcm)


@torch.no_grad()
def test_waiting_conversations_are_copied_in_a_few_a_tick(personaplex_checkpoint: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """COPIES_PER_TICK bounds the copies before one tick (the talking conversations wait for it)."""
    from engine.personaplex import engine as engine_module

    monkeypatch.setattr(engine_module, "COPIES_PER_TICK", 1)
    served = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=3, sampling=Sampling(seed=4))
    for slot in range(3):
        served.start(slot, PERSONA, "NATF2", seed=9)
    quiet = np.zeros((3, served.frame_size), np.float32)
    while served.prefilling(0):
        served.step(quiet, set())
    served.step(quiet, set())
    assert [served.prefilling(slot) for slot in range(3)] == [False, False, True]
    served.step(quiet, set())
    assert not served.prefilling(2) and served.read_prompts.hits == 2


@torch.no_grad()
def test_another_persona_or_voice_is_read_and_the_least_recent_dropped(personaplex_checkpoint: Path):
    served = engine(personaplex_checkpoint)
    served.read_prompts.most = 2
    for persona in (PERSONA, PERSONA + " Briefly.", PERSONA):
        served.start(0, persona, "NATF2")
        talk(served, 0, np.zeros((1, 1920), np.float32))
        served.release(0)
    assert (served.read_prompts.misses, served.read_prompts.hits) == (2, 1)  # the third was the first again
    clip = served.clip_voice(wav_bytes(np.random.default_rng(2).uniform(-0.3, 0.3, 24000), 24000))
    served.start(0, PERSONA, clip)  # a clip's voice: another prompt
    assert served.prefilling(0) and served.read_prompts.misses == 3
    talk(served, 0, np.zeros((1, 1920), np.float32))
    assert len(served.read_prompts.kept) == 2  # two at most: the persona used least recently went
    served.release(0)
    served.start(0, PERSONA + " Briefly.", "NATF2")
    assert served.prefilling(0)  # dropped: read again
    assert served.read_prompts.nbytes > 0


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    import io

    import soundfile

    out = io.BytesIO()
    soundfile.write(out, pcm.astype(np.float32), rate, format="WAV", subtype="FLOAT")
    return out.getvalue()


@torch.no_grad()
def test_a_tick_that_moves_nobody_runs_only_the_prompt_chunk(personaplex_checkpoint: Path, monkeypatch):
    """While a system prompt is read and nobody is heard, a tick reads its chunk and runs no model
    (it would change no state): the conversation afterwards is the same (the first test above)."""
    served = engine(personaplex_checkpoint)
    ran: list[int] = []
    run = served.ticks.run
    monkeypatch.setattr(served.ticks, "run", lambda *args: ran.append(args[1]) or run(*args))
    served.start(0, PERSONA + " Alone.", "NATF2")
    chunks = 0
    while served.prefilling(0):
        assert served.step(np.zeros((2, 1920), np.float32), set()) == [None, None]
        chunks += 1
    assert chunks >= 1 and ran == [] and served.timings["bucket"] == 0
    out = served.step(np.zeros((2, 1920), np.float32), {0})
    assert out[0] is not None and ran == [1]  # heard: a tick of the smallest bucket holding slot 0


@torch.no_grad()
def test_a_persona_and_voice_seen_before_are_not_planned_again(personaplex_checkpoint: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    """plans.py: a second conversation with a persona and voice takes the first's plan and key (the
    staging ring is not stepped again: prompt.py `plan` is not called), a clip's voice is planned
    each time, and at most `most` plans are kept, the least recently used dropped."""
    from engine.personaplex import engine as engine_module

    planned: list[int] = []
    real = engine_module.plan
    monkeypatch.setattr(engine_module, "plan", lambda *args: planned.append(1) or real(*args))
    served = engine(personaplex_checkpoint)
    served.start(0, PERSONA, "NATF2")
    served.start(1, PERSONA, "NATF2")
    assert len(planned) == 1 and (served.plans.misses, served.plans.hits) == (1, 1)
    assert served.prompts[0].plan is served.prompts[1].plan and served.prompts[0].key == served.prompts[1].key
    clip = served.clip_voice(wav_bytes(np.random.default_rng(3).uniform(-0.3, 0.3, 24000), 24000))
    served.start(1, PERSONA, clip)
    served.start(1, PERSONA, clip)
    assert len(planned) == 3 and len(served.plans.kept) == 1  # a clip's: planned each time, never kept
    served.plans.most = 1
    served.start(1, PERSONA + " Briefly.", "NATF2")
    assert list(served.plans.kept) == [(PERSONA + " Briefly.", "NATF2")]

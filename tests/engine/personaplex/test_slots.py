"""Batched slots: a recycled slot equals a fresh single-slot engine while another slot talks on,
golden replay is deterministic, and a stored voice bundle equals stepping its clip."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile
import torch

from engine.personaplex.engine import Frame, PersonaPlex
from engine.personaplex.sampling import Sampling
from engine.personaplex.streaming import StreamingModule
from engine.personaplex.tiny import voice_clip

GREEDY = Sampling(greedy=True)


def codes(engine: PersonaPlex, ticks: int, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.cfg.lm.card, (ticks, engine.slots, engine.cfg.lm.codebooks), generator=g).numpy()


def assert_same_frames(ours: list[Frame], reference: list[Frame]) -> None:
    assert len(ours) == len(reference)
    for i, (a, b) in enumerate(zip(ours, reference)):
        assert np.array_equal(a.tokens, b.tokens), i
        assert a.text == b.text
        np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-5)


@torch.no_grad()
def test_recycled_slot_equals_a_fresh_engine_while_the_other_slot_talks_on(personaplex_checkpoint: Path):
    batched = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=GREEDY)
    alone = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=GREEDY)
    first, second = "You enjoy having a good conversation.", "Your name is Jane."
    batched.open(persona=first)
    before = codes(batched, 9, seed=1)
    talk0 = [batched.step_codes(c)[0] for c in before]  # slot 0 mid-conversation (and slot 1 too)
    batched.start(1, persona=second, voice="NATF2")  # a new conversation in slot 1, at another step
    after = codes(batched, 20, seed=2)
    out = [batched.step_codes(c) for c in after]  # its prompt is read before the first of these ticks
    talk0 += [f[0] for f in out]
    recycled = [f[1] for f in out]

    alone.open(persona=second, voice="NATF2")
    assert_same_frames(recycled, [alone.step_codes(c[1:])[0] for c in after])
    alone.open(persona=first)
    assert_same_frames(talk0, [alone.step_codes(c[:1])[0] for c in np.concatenate([before, after])])


def poison(engine: PersonaPlex, slot: int) -> None:
    """What a conversation that went non-finite leaves behind: NaN in every float state of its slot."""
    for model in (engine.lockstep.temporal, engine.lockstep.depformer, engine.mimi):
        for module in model.modules():
            if isinstance(module, StreamingModule):
                for buffer in module.buffers(recurse=False):
                    if buffer.is_floating_point() and buffer.dim() and len(buffer) == engine.slots:
                        buffer[slot] = float("nan")


@torch.no_grad()
def test_a_slot_left_non_finite_serves_the_next_conversation_as_a_fresh_engine(personaplex_checkpoint: Path):
    """A masked ring slot still enters attention's sum with weight 0 (0 * NaN is NaN): a
    conversation that went non-finite must not make every later one in its slot fail."""
    batched = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=GREEDY)
    alone = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=GREEDY)
    batched.open(persona="You enjoy having a good conversation.")
    user = codes(batched, 12, seed=5)
    for c in user[:4]:
        batched.step_codes(c)
    poison(batched, 1)
    batched.start(1, persona="Your name is Jane.", voice="NATF2")
    recycled = [batched.step_codes(c)[1] for c in user[4:]]
    assert all(np.isfinite(frame.pcm).all() for frame in recycled)
    alone.open(persona="Your name is Jane.", voice="NATF2")
    assert_same_frames(recycled, [alone.step_codes(c[1:])[0] for c in user[4:]])


@torch.no_grad()
def test_golden_replay_from_codes_is_deterministic(personaplex_checkpoint: Path):
    def replay(sampling: Sampling) -> list[list[Frame]]:
        engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=sampling)
        engine.open(persona="Tell me about the weather.")
        return [engine.step_codes(c) for c in codes(engine, 12, seed=3)]

    for sampling in (GREEDY, Sampling(seed=7)):
        one, two = replay(sampling), replay(sampling)
        for a, b in zip(one, two):
            assert_same_frames(a, b)
    greedy, sampled = replay(GREEDY), replay(Sampling(seed=7))
    assert any(not np.array_equal(a[0].tokens, b[0].tokens) for a, b in zip(greedy, sampled))


@torch.no_grad()
def test_voice_bundle_replays_its_clip(personaplex_checkpoint: Path, tmp_path: Path):
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=GREEDY)
    clip = voice_clip(11, engine.sample_rate) * 0.5
    path = tmp_path / "clip.wav"
    soundfile.write(path, clip, engine.sample_rate, subtype="FLOAT")
    bundle = engine.record_voice(clip)
    assert bundle.embeddings.shape == (len(engine.voice_frames(clip)) - 1, engine.cfg.lm.dim)
    user = codes(engine, 10, seed=4)
    runs = []
    for voice in (bundle, str(path)):
        engine.open(persona="Hello", voice=voice)
        runs.append([engine.step_codes(c)[0] for c in user])
    assert_same_frames(runs[0], runs[1])


@torch.no_grad()
def test_audio_in_audio_out_one_frame_per_tick(personaplex_checkpoint: Path):
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1, sampling=Sampling(seed=1))
    engine.open()
    rng = np.random.default_rng(0)
    for _ in range(4):
        frame = engine.step(rng.uniform(-0.5, 0.5, engine.frame_size).astype(np.float32))[0]
        assert frame is not None and frame.pcm.shape == (engine.frame_size,) and frame.pcm.dtype == np.float32
        assert np.isfinite(frame.pcm).all() and frame.pcm.std() > 0
        assert frame.text is None or isinstance(frame.text, str)
    assert set(engine.timings) == {"encode_ms", "model_ms", "decode_ms", "gpu_ms", "prompt_ms", "bucket", "tick_ms"}


@torch.no_grad()
def test_skipping_the_user_depformer_steps_changes_no_output(personaplex_checkpoint: Path):
    runs = []
    for all_steps in (False, True):
        engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=GREEDY)
        engine.lockstep.all_steps = all_steps  # True: all 16 depformer steps, as the reference runs them
        engine.open(persona="Hello")
        frames = [engine.step_codes(c) for c in codes(engine, 6, seed=5)]
        engine.start(1, persona="Hi", voice=None)  # a prompt read next to a live slot
        frames += [engine.step_codes(c) for c in codes(engine, 6, seed=6)]
        runs.append(frames)
    for slot in (0, 1):
        ours = [f[slot] for f in runs[0] if f[slot] is not None]
        assert len(ours) > 6
        assert_same_frames(ours, [f[slot] for f in runs[1] if f[slot] is not None])


@torch.no_grad()
def test_a_slot_left_out_of_a_tick_keeps_its_place(personaplex_checkpoint: Path):
    """`step(pcm, hearing)` moves on the slots it hears only: a slot left out of a tick (its user's
    frame not in yet) goes on afterwards exactly as if that tick had never run for it (its Mimi
    streams, step, ring and draws), and the slot heard meanwhile is unaffected."""
    def engine() -> PersonaPlex:
        return PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=Sampling(seed=3))

    check_left_out(engine)


def check_left_out(engine: Callable[[], PersonaPlex]) -> None:
    """Two slots of `engine()` heard in every tick, against slot 0 left out of one tick (also on a GPU:
    test_ticks_gpu.py, where the ring kernel skips a held row)."""
    rng = np.random.default_rng(2)
    user = rng.uniform(-0.5, 0.5, (6, 2, 1920)).astype(np.float32)  # [tick, slot, samples]
    together = engine()
    together.open(persona="You enjoy having a good conversation.")
    reference = [together.step(user[k]) for k in range(5)]  # both slots hear every tick

    apart = engine()
    apart.open(persona="You enjoy having a good conversation.")
    heard: list[list[Frame]] = [[], []]
    for k in range(2):
        for slot, frame in enumerate(apart.step(user[k], {0, 1})):
            assert frame is not None
            heard[slot].append(frame)
    garbage = np.stack([rng.uniform(-1, 1, 1920), user[2, 1]]).astype(np.float32)  # slot 0 has no frame yet
    out = apart.step(garbage, {1})
    assert out[0] is None and out[1] is not None
    heard[1].append(out[1])
    for k in range(3, 5):  # slot 0 one frame behind slot 1 from here on
        out = apart.step(np.stack([user[k - 1, 0], user[k, 1]]), {0, 1})
        heard[0].append(out[0])  # type: ignore[arg-type]
        heard[1].append(out[1])  # type: ignore[arg-type]
    heard[0].append(apart.step(np.stack([user[4, 0], user[5, 1]]), {0})[0])  # type: ignore[arg-type]
    for slot in (0, 1):
        assert_same_frames(heard[slot], [frames[slot] for frames in reference])  # type: ignore[misc]

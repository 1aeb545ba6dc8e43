"""Bad inputs get a RequestError that says what to change, and leave the engine usable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import RequestError
from engine.personaplex.engine import PersonaPlex
from engine.personaplex.sampling import Sampling


@pytest.fixture(scope="module")
def engine(personaplex_checkpoint: Path) -> PersonaPlex:
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2, sampling=Sampling(greedy=True))
    engine.open(persona="Hello")
    return engine


@pytest.mark.parametrize("shape", [(2, 1919), (2, 1921), (1, 1920), (1920,), (2, 2, 1920)])
def test_wrong_frame_size(engine: PersonaPlex, shape: tuple[int, ...]):
    with pytest.raises(RequestError, match=r"expected 2 user frame\(s\) of 1920 samples \(80 ms at 24000 Hz\)"):
        engine.step(np.zeros(shape, np.float32))
    assert all(f is not None for f in engine.step(np.zeros((2, 1920), np.float32)))  # still converses


def test_non_finite_audio_and_bad_codes(engine: PersonaPlex):
    frame = np.zeros((2, 1920), np.float32)
    frame[1, 5] = np.nan
    with pytest.raises(RequestError, match="non-finite"):
        engine.step(frame)
    with pytest.raises(RequestError, match=r"user codes of shape \(2, 8\)"):
        engine.step_codes(np.zeros((2, 7), dtype=np.int64))
    with pytest.raises(RequestError, match=r"user codes must be in 0\.\.127"):
        engine.step_codes(np.full((2, 8), 128))


def test_unknown_voice_lists_the_known_ones(engine: PersonaPlex):
    with pytest.raises(RequestError, match=r"unknown voice 'NATM9'.*\(NATF2\)"):
        engine.start(0, persona="Hi", voice="NATM9")
    with pytest.raises(RequestError, match="unknown voice"):
        engine.open(voice="../voices/NATF2")
    assert not engine.prefilling(0)  # nothing was started


def test_persona_too_long_for_the_context(engine: PersonaPlex):
    from engine.personaplex.prompt import check_fits, persona_tokens

    persona = "Let us talk about music, books and films. " * 20
    with pytest.raises(RequestError, match=r"persona is \d+ tokens.*context of 96 frames: shorten the persona "
                                           r"to at most 78 tokens"):
        engine.start(1, persona=persona)
    assert not engine.prefilling(1)
    voice = engine.voice()
    room = engine.cfg.lm.context - 1 - 12 - len(voice.embeddings)  # 78: the boundary is exact
    check_fits(engine.cfg.lm, engine.frame_rate, voice, [5] * room)
    with pytest.raises(RequestError):
        check_fits(engine.cfg.lm, engine.frame_rate, voice, [5] * (room + 1))
    words = persona.split()
    while len(persona_tokens(engine.tokenizer, " ".join(words))) > room:
        words.pop()
    engine.start(1, persona=" ".join(words))  # the longest persona that fits is accepted
    assert engine.prefilling(1)


def test_bad_slot_sampling_and_device(engine: PersonaPlex, personaplex_checkpoint: Path):
    with pytest.raises(RequestError, match=r"slot must be in 0..1"):
        engine.start(2)
    with pytest.raises(RequestError, match="text_temperature must be a non-negative number"):
        engine.set_sampling(Sampling(text_temperature=-1.0))
    with pytest.raises(RequestError, match="audio_top_k must be an integer >= 1"):
        engine.set_sampling(Sampling(audio_top_k=0))
    with pytest.raises(RequestError, match="slots must be an integer >= 1"):
        PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=0)
    with pytest.raises(RequestError, match="device must be"):
        PersonaPlex.load(personaplex_checkpoint, device="tpu")


def test_bad_voice_files(engine: PersonaPlex, tmp_path: Path):
    torch.save({"embeddings": torch.zeros(3, 1, 1, 7), "cache": torch.zeros(1, 17, 4, dtype=torch.long)},
               tmp_path / "small.pt")
    with pytest.raises(RequestError, match=r"embeddings must be \[T, 1, 1, 64\]"):
        engine.voice(str(tmp_path / "small.pt"))
    torch.save({"cache": torch.zeros(1, 17, 4)}, tmp_path / "half.pt")
    with pytest.raises(RequestError, match="must hold 'embeddings' and 'cache'"):
        engine.voice(str(tmp_path / "half.pt"))
    (tmp_path / "noise.wav").write_bytes(b"RIFF not really a wav")
    with pytest.raises(RequestError, match=r"^noise\.wav is not a WAV or FLAC file this server can read "
                                          r"\(Format not recognised\); give a WAV or FLAC file$"):
        engine.voice(str(tmp_path / "noise.wav"))
    import soundfile

    soundfile.write(tmp_path / "short.wav", np.full(2400, 0.1, np.float32), 24000)
    with pytest.raises(RequestError, match=r"give at least 0\.4 s"):
        engine.voice(str(tmp_path / "short.wav"))
    soundfile.write(tmp_path / "silent.wav", np.zeros(24000, np.float32), 24000)
    with pytest.raises(RequestError, match="the voice clip is silent"):
        engine.voice(str(tmp_path / "silent.wav"))


def test_broken_checkpoints_name_the_problem(personaplex_checkpoint: Path, tmp_path: Path):
    def copy(name: str) -> Path:
        root = tmp_path / name
        shutil.copytree(personaplex_checkpoint, root)
        return root

    root = copy("missing")
    state = load_file(str(root / "model.safetensors"))
    del state["depformer_emb.7.weight"]  # PersonaPlex's 8 -> 16 copy cannot make this one
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(RequestError, match=r"model.safetensors lacks 1 tensors.*depformer_emb.7.weight"):
        PersonaPlex.load(root, device="cpu")
    root = copy("config")
    raw = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**raw, "norm": "layer_norm"}))
    with pytest.raises(RequestError, match=r"config.norm must be 'rms_norm_f32'"):
        PersonaPlex.load(root, device="cpu")
    (root / "config.json").write_text(json.dumps({**raw, "dim": 48}))
    with pytest.raises(RequestError, match=r"wrong shape.*text_emb.weight \(101, 64\) \(expected \(101, 48\)\)"):
        PersonaPlex.load(root, device="cpu")
    with pytest.raises(RequestError, match="neither a checkpoint directory nor a Hugging Face repo id"):
        PersonaPlex.load(tmp_path / "nowhere", device="cpu")


def test_text_pieces_leave_out_what_is_never_said(engine: PersonaPlex):
    """Padding, control pieces and the persona's `<system>` tag (which the model can sample) are not
    text; a word piece is, with SentencePiece's "▁" as a space."""
    tokenizer = engine.tokenizer
    system = tokenizer.piece_to_id("<system>")  # type: ignore[attr-defined]
    assert tokenizer.id_to_piece(system) == "<system>"
    hidden = [0, 3, system, tokenizer.bos_id(), tokenizer.eos_id()]  # type: ignore[attr-defined]
    assert [engine.text_piece(token) for token in hidden] == [None] * len(hidden)
    word = next(t for t in range(tokenizer.vocab_size()) if tokenizer.id_to_piece(t).startswith("\u2581")
                and len(tokenizer.id_to_piece(t)) > 1 and not tokenizer.is_control(t))
    assert engine.text_piece(word) == " " + tokenizer.id_to_piece(word)[1:]

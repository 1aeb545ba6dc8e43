"""The system prompt of a conversation, as a programme of prefill ticks for one slot.

Order (PP-lm `step_system_prompts`; reference/personaplex.md §3.2): the voice, 0.5 s of
silence, the persona wrapped in `<system>` tags one token a tick, 0.5 s of silence. During
all of it the user stream carries the sine codes and the agent stream silence codes (or
the voice clip's codes); the text stream is forced to PAD, or to the persona token.

Design choices:
- A programme starts with a `sacrifice` tick: the cold-start tick of a fresh engine (no
  model step), or, for a slot reset mid-batch, one model step whose key/value write is
  hidden (its position is -1) and whose samples are all overwritten by the warm-up gate.
  Either way the slot's next tick is its local step 1, as for a fresh stream.
- The reference loses the first token-stepped prompt tick to that cold start (`LMGen.step`
  returns None at offset 0), while a stored voice's first embedding is stepped again
  after it (`step_embeddings` loops). We keep both behaviours: a voice bundle's embeddings
  all follow the sacrifice; otherwise the first prompt tick is dropped.
- A voice bundle's staging cache (`restore`) is put back at the start of the first
  silence tick, i.e. right after the voice ticks, as the reference's `voice_end` does
  between ticks (a slot's staging ring counts from its own stream start, staging.py, so
  the cache needs no roll).
- Every stream is forced during a system prompt, so nothing in it depends on a sample: the
  whole programme is planned on the host first (`plan`: the staging ring stepped tick by
  tick, staging.py), giving the model input of every prompt position and the ring after
  the prompt. The model then reads the prompt as chunks of many positions (lockstep.py
  `prefill`), not one position per 80 ms tick: a system prompt takes a few ticks of
  wall time while the other slots keep talking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

import engine.personaplex.staging as staging
from engine.errors import RequestError
from engine.personaplex.config import PAD_TOKEN, SILENCE_SECONDS, LMConfig

SYSTEM_TAG = "<system>"


@dataclass(frozen=True)
class PrefillStep:
    kind: Literal["sacrifice", "voice", "tokens"]
    embedding: torch.Tensor | None = None  # "voice": the whole model input [D]
    agent: tuple[int, ...] | None = None  # "tokens": forced agent codes (silence or the voice clip)
    text: int = PAD_TOKEN  # forced text token
    user_sine: bool = False  # user stream: sine codes (else the initial tokens)
    restore: torch.Tensor | None = None  # staging cache [K, CT] restored before this tick


@dataclass(frozen=True)
class Voice:
    """A voice prompt: a stored bundle (`embeddings` [T, D] + `cache` [K, CT]) or clip codes [T, codebooks]."""

    name: str
    embeddings: torch.Tensor | None = None
    cache: torch.Tensor | None = None
    frames: torch.Tensor | None = None

    @property
    def ticks(self) -> int:
        """The system prompt ticks the voice takes."""
        voice = self.embeddings if self.embeddings is not None else self.frames
        return 0 if voice is None else len(voice)


def wrap_with_system_tags(text: str) -> str:
    """`<system> {text} <system>` unless already wrapped (PP `wrap_with_system_tags`)."""
    cleaned = text.strip()
    if cleaned.startswith(SYSTEM_TAG) and cleaned.endswith(SYSTEM_TAG):
        return cleaned
    return f"{SYSTEM_TAG} {cleaned} {SYSTEM_TAG}"


class TextTokenizer(Protocol):
    """What the engine uses of the checkpoint's SentencePiece model (`SentencePieceProcessor`)."""

    def encode(self, text: str) -> list[int]: ...
    def vocab_size(self) -> int: ...
    def is_control(self, token: int) -> bool: ...
    def id_to_piece(self, token: int) -> str: ...


def persona_tokens(tokenizer: TextTokenizer, persona: str | None) -> list[int]:
    """The persona's text tokens; an empty persona has none."""
    if persona is None or not persona.strip():
        return []
    return list(tokenizer.encode(wrap_with_system_tags(persona)))


def silence_frames(frame_rate: float) -> int:
    return int(SILENCE_SECONDS * frame_rate)


def system_prompt(cfg: LMConfig, frame_rate: float, voice: Voice | None, persona: list[int]) -> list[PrefillStep]:
    """The slot programme: sacrifice, voice, silence, persona, silence."""
    silence = tuple(cfg.silence_tokens)
    token_steps: list[PrefillStep] = []
    voice_steps: list[PrefillStep] = []
    restore = None
    if voice is not None and voice.embeddings is not None:
        voice_steps = [PrefillStep("voice", embedding=e) for e in voice.embeddings]
        restore = voice.cache
    elif voice is not None and voice.frames is not None:
        token_steps = [PrefillStep("tokens", agent=tuple(int(c) for c in f), user_sine=True) for f in voice.frames]
    spacer = [PrefillStep("tokens", agent=silence, user_sine=True) for _ in range(silence_frames(frame_rate))]
    if spacer and restore is not None:
        spacer[0] = PrefillStep("tokens", agent=silence, user_sine=True, restore=restore)
    token_steps += spacer
    token_steps += [PrefillStep("tokens", agent=silence, text=t, user_sine=True) for t in persona]
    token_steps += [PrefillStep("tokens", agent=silence, user_sine=True) for _ in range(silence_frames(frame_rate))]
    if not voice_steps:
        token_steps = token_steps[1:]  # falls on the cold-start tick, as in the reference
    return [PrefillStep("sacrifice"), *voice_steps, *token_steps]


def check_fits(cfg: LMConfig, frame_rate: float, voice: Voice | None, persona: list[int]) -> None:
    """The system prompt must fit in the model's context window, or its start would be forgotten."""
    voice_ticks = 0 if voice is None else voice.ticks
    fixed = 2 * silence_frames(frame_rate) + voice_ticks
    if fixed + len(persona) > cfg.context - 1:
        room = cfg.context - 1 - fixed
        raise RequestError(
            f"the persona is {len(persona)} tokens, but with the voice prompt ({voice_ticks} frames) and the "
            f"silences ({2 * silence_frames(frame_rate)} frames) the system prompt must fit in the model's "
            f"context of {cfg.context} frames: shorten the persona to at most {max(room, 0)} tokens")


@dataclass(frozen=True)
class Plan:
    """A system prompt as the model reads it: one input per position 0 .. positions - 1."""

    inputs: torch.Tensor  # [positions, K] the tokens of each model input (CPU)
    embeddings: list[torch.Tensor | None]  # per position: a voice embedding [D] that replaces the input
    ring: torch.Tensor  # [K, CT] the staging ring after the prompt
    provided: torch.Tensor  # [K, CT] bool
    ticks: int  # the slot's local step after the prompt

    @property
    def positions(self) -> int:
        return len(self.inputs)


def initial_tokens(cfg: LMConfig) -> torch.Tensor:
    """[K]: the initial token of each row (text: text_card, audio: card)."""
    return torch.tensor([cfg.text_card] + [cfg.card] * cfg.n_q)


def plan(cfg: LMConfig, steps: list[PrefillStep]) -> Plan:
    """Step a fresh staging ring through the programme (CPU): every stream is forced, so no sample enters."""
    K, CT, n = cfg.rows, cfg.ring_columns, cfg.codebooks
    initial, delays = initial_tokens(cfg), torch.tensor(cfg.delays)
    ring = initial[None, :, None].repeat(1, 1, CT)  # [1, K, CT]: a fresh stream
    provided = torch.zeros(1, K, CT, dtype=torch.bool)
    local = torch.zeros(1, dtype=torch.long)
    every, one = torch.ones(1, K, dtype=torch.bool), torch.ones(1, dtype=torch.bool)
    inputs, embeddings = [], []
    for i, step in enumerate(steps):
        if step.restore is not None:
            ring[0] = step.restore.cpu()
        values = initial.clone()
        values[0] = step.text
        if step.agent is not None:
            values[1:1 + n] = torch.tensor(step.agent)
        if step.user_sine:
            values[1 + n:] = torch.tensor(cfg.sine_tokens)
        staging.write(ring, provided, local, delays, values[None], every)
        staging.gate(ring, provided, local, delays, initial, one)
        source, target, forced = staging.read(ring, provided, local)
        assert bool(forced.all()), "a system prompt forces every stream"
        if i > 0:  # local step 0 is the stream's first tick: its input (position -1) is never seen
            inputs.append(source[0])
            embeddings.append(step.embedding)
        staging.commit(ring, provided, local, target, one)
    return Plan(torch.stack(inputs) if inputs else torch.zeros(0, K, dtype=torch.long), embeddings, ring[0],
                provided[0], len(steps))

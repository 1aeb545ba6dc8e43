"""Drama 3 prompts: the take's text, voice and directing history as frame rows.

A frame row is `[main token, code0 .. code9]`. Text rows are `[token id, 0, ..., 0]`;
audio rows are `[code0 + semantic_start, code0, ..., code9]`.

Layouts (the seed's, which are sglang-omni's `reference-bracket-v1` plus the
described-character and directing-history layouts of the Drama 3 Space):

    <|im_start|>system\\n
      stock:      convert the provided text to speech
      references: convert the provided text to speech reference to the following:
                  \\n\\n[Reference i]\\nText: <|speaker:0|> transcript\\nSpeech: <codes>   (each)
      character:  [Scene: scene\\n]Characters:\\n- name: description (each of the cast)\\n<scene instruction>
    <|im_end|>\\n
    history, oldest first (each):
      <|im_start|>user\\n  turn text  <|im_end|>\\n  <|im_start|>assistant\\n<|voice|>  <codes>  <|im_end|>\\n
    <|im_start|>user\\n  text  <|im_end|>\\n  <|im_start|>assistant\\n<|voice|>

Turn text is `<|speaker:0|> text` (stock and references) or `name: text` (character: the
turn's own speaker's name, else the take's).

Design choices:
- Every literal is tokenised on its own: tokenising the joined string changes ids at
  the seams. A layout is therefore a list of segments (strings and code tensors), and
  rows are computed per segment.
- History is codes, never audio: a retake does not re-encode anything. Codes cross the
  engine's boundary as numpy int64 arrays [num_codebooks, frames] (what the server
  stores); the rows a prompt becomes are torch, the engine's own.
- `build_prompt` checks everything a caller can get wrong (text, codes, character
  fields, the row limit), whoever the caller is (the CLI, the studio, the HTTP API).
- History turns are tokenised separately, so dropping the oldest turns to fit the row
  limit costs no re-tokenising, and an engine lays each part out once across takes
  (prompt_rows.py: a retake with 4,000 rows of history built its prompt in 5.8 ms).
- A scene with several described characters is one layout: the system lists the whole cast
  (`Character.cast`, the same list for every character's take, so their prompts share that
  prefix), each history turn is `speaker: text` with its own speaker, and the line is the
  take's character's. That is the Drama 3 Space's scene layout; the reference layout has one
  speaker (speaker 0, as sglang-omni allows), so there every turn is that speaker's.
- A prompt names its boundaries: the rows where the system message and each history turn
  end. Consecutive prompts of a scene share everything up to one of them, so they are the
  prefix cache's snapshot points (prefix.py).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from tokenizers import Tokenizer

from engine.drama3.config import Drama3Config
from engine.drama3.sampling import MAX_NEW_TOKENS, Sampling
from engine.drama3.text import check_line, check_text, reference_transcript, with_speaker_tag
from engine.errors import RequestError

SYSTEM_START = "<|im_start|>system\n"
USER_START = "<|im_start|>user\n"
TTS_INSTRUCTION = "convert the provided text to speech"
REFERENCE_INSTRUCTION = "convert the provided text to speech reference to the following:"
SCENE_INSTRUCTION = "Voice every line of the script in order, with <|audio_separator|> between consecutive lines."
MESSAGE_END = "<|im_end|>\n"
GENERATION_START = "<|im_start|>assistant\n<|voice|>"
MAX_PROMPT_ROWS = 8192

Codes = NDArray[np.int64]  # [num_codebooks, frames], host-side
Segment = str | Codes


@dataclass(frozen=True)
class Reference:
    """A voice reference: the clip's codes [num_codebooks, frames] and its transcript."""

    codes: Codes
    transcript: str


@dataclass(frozen=True)
class Character:
    """A described character (instead of references): single-line fields. `cast`: every described
    character of the scene, this one included, in the scene's order (empty: this one alone)."""

    name: str
    description: str
    scene: str | None = None
    cast: tuple[Character, ...] = ()


@dataclass(frozen=True)
class HistoryTurn:
    """An earlier take of the scene: its text and its codes [num_codebooks, frames]."""

    text: str
    codes: Codes
    speaker: str | None = None  # a described character's name: who said it (None: the take's character)


@dataclass(frozen=True)
class Prompt:
    rows: torch.Tensor  # int64 [R, 1 + num_codebooks], CPU
    history_used: int  # how many of the newest history turns the rows hold
    sampling: Sampling
    prompt_ms: float = 0.0  # time spent building it (reference encoding included)
    # Row counts where the system message and each history turn end (ascending, < R): the
    # prefix cache's snapshot points, and where prefill cuts its chunks (prefix.py).
    boundaries: tuple[int, ...] = ()


Voice = list[Reference] | Character | None


# ─── Layout ───────────────────────────────────────────────────────────────────


def turn_text(text: str, character: Character | None, speaker: str | None = None) -> str:
    return f"{speaker or character.name}: {text}" if character is not None else with_speaker_tag(text)


def system_segments(voice: Voice) -> list[Segment]:
    segments: list[Segment] = [SYSTEM_START]
    if isinstance(voice, Character):
        lines = [f"Scene: {voice.scene}"] if voice.scene else []
        lines += ["Characters:", *(f"- {c.name}: {c.description}" for c in voice.cast or (voice,)), SCENE_INSTRUCTION]
        segments.append("\n".join(lines))
    else:
        segments.append(REFERENCE_INSTRUCTION if voice else TTS_INSTRUCTION)
        for index, reference in enumerate(voice or [], 1):
            segments += [f"\n\n[Reference {index}]\nText: {reference_transcript(reference.transcript)}\nSpeech: ",
                         reference.codes]
    segments.append(MESSAGE_END)
    return segments


def history_segments(turn: HistoryTurn, character: Character | None) -> list[Segment]:
    return [USER_START, turn_text(turn.text, character, turn.speaker), MESSAGE_END, GENERATION_START, turn.codes,
            MESSAGE_END]


def line_segments(text: str, character: Character | None) -> list[Segment]:
    return [USER_START, turn_text(text, character), MESSAGE_END, GENERATION_START]


def build_segments(text: str, voice: Voice, history: list[HistoryTurn]) -> list[Segment]:
    """The whole layout, in order (checked input assumed)."""
    character = voice if isinstance(voice, Character) else None
    segments = system_segments(voice)
    for turn in history:
        segments += history_segments(turn, character)
    return segments + line_segments(text, character)


def segment_rows(segments: Sequence[Segment], tokenizer: Tokenizer, config: Drama3Config) -> torch.Tensor:
    """Rows [R, 1 + num_codebooks] of segments; each string is tokenised on its own."""
    width = config.frame_width
    rows = [torch.zeros((0, width), dtype=torch.long)]
    for segment in segments:
        if isinstance(segment, str):
            ids = torch.tensor(tokenizer.encode(segment).ids, dtype=torch.long)  # [T]
            text_rows = torch.zeros((len(ids), width), dtype=torch.long)  # [T, 11]
            text_rows[:, 0] = ids
            rows.append(text_rows)
        else:
            codes = torch.tensor(segment, dtype=torch.long)  # [10, F], a copy: stored arrays may be read-only
            rows.append(torch.cat((codes[:1] + config.semantic_start_token_id, codes)).T)  # [F, 11]
    return torch.cat(rows)


# ─── Checks ───────────────────────────────────────────────────────────────────


def checked_codes(codes: object, location: str, config: Drama3Config, *, empty: bool = False) -> Codes:
    """Codes as a contiguous int64 array [num_codebooks, frames], at least one frame (unless
    `empty`), every code in [0, codebook_size) (sglang-omni checks every codebook against
    the semantic size)."""
    n, size = config.num_codebooks, config.codebook_size
    if (not isinstance(codes, np.ndarray) or not np.issubdtype(codes.dtype, np.integer)
            or codes.ndim != 2 or codes.shape[0] != n or (codes.shape[1] == 0 and not empty)):
        shape = codes.shape if isinstance(codes, np.ndarray) else type(codes).__name__
        frames = "" if empty else " with at least one frame"
        raise RequestError(f"{location} codes must be an integer [{n}, frames] array{frames}; got {shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= size):
        raise RequestError(f"{location} codes must be in [0, {size})")
    return np.ascontiguousarray(codes, dtype=np.int64)


def checked_name(name: object, location: str) -> str:
    name = check_line(name, location)
    if ":" in name:
        raise RequestError(f"{location} must not contain ':' (the script writes 'name: line'); remove it")
    return name


def checked_character(character: Character, location: str = "character") -> Character:
    name = checked_name(character.name, f"{location}.name")
    description = check_line(character.description, f"{location}.description")
    scene = None if character.scene is None else check_line(character.scene, f"{location}.scene")
    cast = tuple(checked_character(c, f"{location}.cast.{i}") for i, c in enumerate(character.cast))
    if cast and name not in [c.name for c in cast]:
        raise RequestError(f"{location}.cast must hold the character itself ({name!r})")
    return Character(name=name, description=description, scene=scene, cast=cast)


def checked_voice(voice: object, config: Drama3Config) -> Voice:
    if voice is None or isinstance(voice, Character):
        return None if voice is None else checked_character(voice)
    if not isinstance(voice, (list, tuple)) or not all(isinstance(r, Reference) for r in voice):
        raise RequestError("voice must be a list of references, a character, or none")
    return [Reference(codes=checked_codes(r.codes, f"references.{i}", config),
                      transcript=check_text(r.transcript, f"references.{i}.text"))
            for i, r in enumerate(voice)] or None


def build_prompt(text: str, voice: object, history: list[HistoryTurn], sampling: Sampling,
                 tokenizer: Tokenizer, config: Drama3Config, *, max_rows: int = MAX_PROMPT_ROWS,
                 max_new_tokens: int = MAX_NEW_TOKENS, drop_oldest_history: bool = False,
                 rows: Callable[[Sequence[Segment]], torch.Tensor] | None = None) -> Prompt:
    """Check a take's inputs and lay them out as rows (each part by `rows`: `segment_rows`, or
    an engine's PromptRows cache of the parts laid out before, prompt_rows.py).

    If the rows pass `max_rows`, the oldest history turns are dropped when
    `drop_oldest_history` is set; otherwise (or if no history is left to drop) the
    request is refused. `max_new_tokens` is the most frames the sampling may ask for."""
    text = check_text(text, "text")
    voice = checked_voice(voice, config)
    sampling = sampling.checked(max_new_tokens)
    if not all(isinstance(turn, HistoryTurn) for turn in history):
        raise RequestError("history must be a list of (text, codes) turns")
    history = [HistoryTurn(text=check_text(turn.text, f"history.{i}.text"),
                           codes=checked_codes(turn.codes, f"history.{i}", config),
                           speaker=None if turn.speaker is None else checked_name(turn.speaker, f"history.{i}.speaker"))
               for i, turn in enumerate(history)]
    character = voice if isinstance(voice, Character) else None
    layout = rows or functools.partial(segment_rows, tokenizer=tokenizer, config=config)
    head = layout(system_segments(voice))
    turns = [layout(history_segments(turn, character)) for turn in history]
    tail = layout(line_segments(text, character))
    total = len(head) + sum(map(len, turns)) + len(tail)
    kept = 0
    if drop_oldest_history:
        while turns[kept:] and total > max_rows:
            total -= len(turns[kept])
            kept += 1
    if total > max_rows:
        advice = ("shorten the text or the voice references" if drop_oldest_history or not turns
                  else "shorten it, use fewer history turns, or let the oldest be dropped")
        raise RequestError(f"a prompt of {total} rows exceeds the maximum allowed length of {max_rows} rows; {advice}")
    ends = itertools.accumulate((len(head), *map(len, turns[kept:])))
    return Prompt(rows=torch.cat((head, *turns[kept:], tail)), history_used=len(turns) - kept, sampling=sampling,
                  boundaries=tuple(ends))

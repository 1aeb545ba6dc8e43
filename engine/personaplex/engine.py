"""The PersonaPlex engine: B conversation slots that listen and speak together, 80 ms a tick.

    engine = PersonaPlex.load("DIR")                   # or None: the tiny demo checkpoint
    engine.open(persona="You are ...", voice="NATF2")  # every slot gets this system prompt at once
    frames = engine.step(user_pcm)                     # [B, 1920] float -> per slot Frame | None
    engine.start(slot, persona, voice, seed=7)         # a new conversation in one slot while the others talk
    engine.release(slot)                               # the slot is free (the others keep talking)
    frames = engine.step_codes(user_codes)             # golden replay from precomputed codes

Design choices:
- One thread owns an engine. A tick (ticks.py) is: Mimi-encode every slot's user frame, one
  lockstep tick (lockstep.py), Mimi-decode the agent codes of the slots that speak (the
  others get silence codes: their agent rows may hold the initial token, which is out of
  range for the codebooks), on static buffers, so on CUDA it replays one captured graph
  per batch bucket: a tick runs the first n slots, n the smallest bucket holding every
  slot in use.
- A slot is free, reading its system prompt, or live. A system prompt is planned on the
  host (prompt.py) and read in chunks of up to PROMPT_CHUNK positions, one chunk before
  each tick, while the slot waits and the others keep their tick (on CUDA by graphs into a
  scratch ring row, then copied into the slot: prompt_reader.py). Once read the slot takes
  the planned staging ring, its Mimi streams restart (as the reference's) and it is live.
  A prompt read (or planned) before, the same persona and voice, is copied in (read_prompts.py, plans.py).
- `open` reads one system prompt into every slot, OPEN_ROWS slots at a time, with no tick.
- `step(pcm, hearing)` moves on the live slots in `hearing` only (default: all): the others
  keep their place (the lockstep's `active` rows, and Mimi's streams held on the same mask,
  ticks.py), so a server can tick as frames arrive and hear whoever has one
  (backend/conversation/loop.py). A slot whose prompt is read in a tick is live from that
  tick on; with `hearing` it moves when it is heard. A tick that moves nobody (a system
  prompt's chunk while nobody has audio) runs no model: it would change no state.
- Sampling settings and seeds are per slot (sampling.py): a seeded conversation is reproducible.
- Text pieces: EPAD (0), PAD (3), SentencePiece's control pieces and the persona's `<system>` tag
  (a piece the model can sample, never says) are hidden; "▁" is a space.
- `record_voice` makes a voice bundle from a clip as the reference saves one (voices.py).
- The key/value ring is float8 on CUDA by default (`kv`, ring.py): 128 conversations of full
  context fit on one H200; the Triton kernels run on CUDA unless `fused=False`, the compiled
  depformer, Helium and Mimi layers (compiled_*.py) unless `compiled=False`. `memory()` says
  what a conversation costs.
- No checkpoint: the tiny demo (tiny.py). Device and dtype are engine/device.py's. Audio and codes
  cross the boundary as numpy; a `Voice` is the engine's (from `voice` / `clip_voice`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from engine.checkpoints import resolve_checkpoint
from engine.device import model_dtype, pick_device
from engine.errors import RequestError
from engine.personaplex.checkpoint import HUB_PATTERNS, load_lm, load_mimi, load_tokenizer, read_config, voices_dir
from engine.personaplex.compiled_mimi import CompiledMimiLayer
from engine.personaplex.config import EPAD_TOKEN, PAD_TOKEN, PersonaPlexConfig
from engine.personaplex.depformer import Depformer
from engine.personaplex.lockstep import Lockstep
from engine.personaplex.memory import check_memory, stream_bytes
from engine.personaplex.mimi import LayerFn, Mimi, run_layer
from engine.personaplex.plans import Plans
from engine.personaplex.prompt import (
    SYSTEM_TAG,
    Plan,
    PrefillStep,
    TextTokenizer,
    Voice,
    check_fits,
    persona_tokens,
    plan,
    system_prompt,
)
from engine.personaplex.prompt_reader import PromptReader
from engine.personaplex.read_prompts import ReadPrompts
from engine.personaplex.ring import FP8
from engine.personaplex.sampling import Sampling
from engine.personaplex.temporal import Temporal
from engine.personaplex.ticks import Ticks
from engine.personaplex.tiny import demo_checkpoint
from engine.personaplex.voices import (
    AUDIO_SUFFIXES,
    clip_codes,
    find_voice,
    list_voices,
    load_bundle,
    read_audio,
    record_voice,
)
from engine.readback import to_device

DEFAULT_VOICE = "NATF2"  # vllm-omni's default; the tiny checkpoint ships it
DEFAULT_PERSONA = ("You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
                   "engaging way.")  # PP-offline's default --text-prompt
_DEFAULT = object()
MAX_CLIP_SECONDS = 30.0  # a voice clip given as audio (the released voices are prompts of a few seconds)
COPIES_PER_TICK = 16  # read prompts copied into waiting slots before one tick
PROMPT_CHUNK = 256  # system prompt positions read before one tick (a persona of a few hundred tokens: one tick)
OPEN_ROWS = 16  # rows `open` reads at once: a chunk dequantises each row's ring (~0.25 GiB at the released size)
KV_CHOICES = ("auto", "model", "float8")  # auto: float8 on CUDA, the model's dtype elsewhere


@dataclass
class Frame:
    pcm: NDArray[np.float32]  # [frame_size], the agent's audio for this tick
    text: str | None  # the agent's text piece, None for padding
    tokens: NDArray[np.int64]  # [K] the de-delayed tokens: text, agent codes, user codes


@dataclass
class _Prompt:  # a system prompt being read into a slot, a chunk before each tick
    plan: Plan
    read: int = 0  # positions read so far
    key: bytes | None = None  # its key among the read prompts kept (read_prompts.py), once read


def configure_rings(temporal: Temporal, kv: str, fused: bool, device: torch.device) -> None:
    """Helium's key/value ring dtype and kernel, before its streams are set up."""
    if kv not in KV_CHOICES:
        raise RequestError(f"kv must be one of {', '.join(KV_CHOICES)}; got {kv!r}")
    float8 = kv == "float8" or (kv == "auto" and device.type == "cuda")
    for ring in temporal.rings():
        ring.kv_dtype = FP8 if float8 else None
        ring.fused = fused


class PersonaPlex:
    name = "personaplex"

    def __init__(self, root: Path, cfg: PersonaPlexConfig, lockstep: Lockstep, mimi: Mimi, tokenizer: TextTokenizer,
                 device: torch.device, sampling: Sampling, graphs: bool = True, parts: bool = False,
                 buckets: list[int] | None = None, compiled: bool = False) -> None:
        self.root = root
        self.cfg = cfg
        self.lockstep = lockstep
        self.mimi = mimi
        self.voice_mimi = mimi.sharing_weights()  # one more stream, for voice clips
        self.tokenizer = tokenizer
        self.device = device
        self.slots = lockstep.slots
        self.sample_rate = cfg.mimi.sample_rate
        self.frame_size = cfg.mimi.frame_size
        self.frame_rate = cfg.mimi.frame_rate
        self.demo_weights = cfg.demo_weights
        self.voices = voices_dir(root)
        self.silence = torch.tensor(cfg.lm.silence_tokens, device=device)
        self.timings: dict[str, float] = {}
        self.sampling = sampling.checked()
        self.prompts: dict[int, _Prompt] = {}  # slot -> its system prompt being read
        self.read_prompts = ReadPrompts(lockstep.temporal)  # prompts read before: a new conversation copies them
        self.plans = Plans(lambda persona, voice: plan(cfg.lm, self.programme(persona, self.voice(voice))),
                           self.read_prompts.key)  # system prompts planned before, by persona and voice
        self.live: set[int] = set()  # slots in a conversation past their system prompt
        # the rows a tick moves on (the live ones it hears), copied into the lockstep's `active` before it
        self.moving_host = torch.zeros(self.slots, dtype=torch.bool, pin_memory=device.type == "cuda")
        self.moving = self.moving_host.numpy()
        mimi.setup_streams(self.slots)
        # Mimi's transformer layers in a tick: compiled with the rest of the tick, or eager
        self.mimi_layer: LayerFn = CompiledMimiLayer() if compiled else run_layer
        self.ticks = Ticks(mimi, lockstep, self.silence, device, graphs=graphs, parts=parts, buckets=buckets,
                           layer=self.mimi_layer)
        self.reader = PromptReader.made(lockstep, graphs)  # a joiner's prompt by graphs (CUDA), else None
        lockstep.sampling.set(slice(None), self.sampling)

    @staticmethod
    def load(checkpoint: str | Path | None = None, device: str = "auto", slots: int = 1,
             sampling: Sampling | None = None, graphs: bool = True, kv: str = "auto", fused: bool = True,
             parts: bool = False, compiled: bool | None = None) -> PersonaPlex:
        """`graphs`: replay CUDA graphs on a GPU (ignored on CPU); `kv`: the key/value ring's dtype
        (KV_CHOICES); `fused`: the Triton kernels on a GPU; `parts`: time encode, model and decode apart;
        `compiled`: the depformer's steps compiled by Inductor (None: on CUDA)."""
        check_slots(slots)
        dev = pick_device(device)
        root = demo_checkpoint() if checkpoint is None else resolve_checkpoint(checkpoint, HUB_PATTERNS)
        cfg = read_config(root)
        temporal, depformer = load_lm(root, cfg, dev, model_dtype(dev))
        return PersonaPlex.build(root, cfg, temporal, depformer, load_mimi(root, cfg, dev), load_tokenizer(root, cfg),
                                 dev, slots, sampling or Sampling(), graphs, kv, fused, parts, compiled=compiled)

    @staticmethod
    def build(root: Path, cfg: PersonaPlexConfig, temporal: Temporal, depformer: Depformer, mimi: Mimi,
              tokenizer: TextTokenizer, device: torch.device, slots: int, sampling: Sampling, graphs: bool = True,
              kv: str = "auto", fused: bool = True, parts: bool = False, buckets: list[int] | None = None,
              compiled: bool | None = None) -> PersonaPlex:
        """An engine of `slots` slots on loaded modules (streams set up anew, weights frozen); `buckets`: the
        batch sizes a tick may run (default 1, 2, 4, ... slots); `compiled`: the compiled depformer (None: CUDA)."""
        check_slots(slots)
        for module in (temporal, depformer, mimi):
            module.requires_grad_(False)  # no autograd history anywhere (prompt_reader.py: 59 GiB of it)
        configure_rings(temporal, kv, fused and device.type == "cuda", device)
        scratch = graphs and device.type == "cuda"  # a ring row to read prompts in by graphs (prompt_reader.py)
        check_memory(cfg, temporal, slots, device, spare=scratch)
        compiled = device.type == "cuda" if compiled is None else compiled
        lockstep = Lockstep(cfg.lm, temporal, depformer, slots, device, compiled=compiled, scratch=scratch)
        return PersonaPlex(root, cfg, lockstep, mimi, tokenizer, device, sampling, graphs, parts, buckets, compiled)

    @property
    def limits(self) -> dict[str, int]:
        return {"context_frames": self.cfg.lm.context, "slots": self.slots, "frame_size": self.frame_size,
                "sample_rate": self.sample_rate}

    def set_sampling(self, sampling: Sampling) -> None:
        """The settings of every slot from now on (and of conversations started later)."""
        self.sampling = sampling.checked()
        self.lockstep.sampling.set(slice(None), self.sampling)

    # -- voices and system prompts ---------------------------------------------------------

    def voice_names(self) -> list[str]:
        return list_voices(self.voices)

    def voice(self, name: str | Voice | object | None = _DEFAULT) -> Voice | None:
        """A voice by bundle name or path (.pt bundle or audio clip); the default is NATF2 when present."""
        if isinstance(name, Voice) or name is None:
            return name
        if name is _DEFAULT:
            names = self.voice_names()
            if not names:
                return None
            name = DEFAULT_VOICE if DEFAULT_VOICE in names else names[0]
        assert isinstance(name, str)
        path = find_voice(self.voices, name)
        if path.suffix.lower() in AUDIO_SUFFIXES:
            return Voice(name=path.stem, frames=self.voice_frames(read_audio(path, self.sample_rate)))
        return load_bundle(path, self.cfg.lm, self.device)

    def clip_voice(self, clip: bytes, name: str = "your clip") -> Voice:
        """The voice of a clip (WAV/FLAC file bytes, any rate), Mimi-encoded as a voice prompt; one
        frame to MAX_CLIP_SECONDS long (RequestError says what to change)."""
        pcm = read_audio(clip, self.sample_rate)
        if not self.frame_size <= len(pcm) <= MAX_CLIP_SECONDS * self.sample_rate:
            raise RequestError(f"a voice clip must be {self.frame_size / self.sample_rate * 1000:.0f} ms to "
                               f"{MAX_CLIP_SECONDS:.0f} s long; this one is {len(pcm) / self.sample_rate:.2f} s")
        return Voice(name=name, frames=self.voice_frames(pcm))

    def voice_frames(self, pcm: NDArray[np.floating[Any]]) -> torch.Tensor:
        """A voice clip (mono float at 24 kHz) -> Mimi codes [frames, codebooks], as the reference encodes it."""
        return clip_codes(self.voice_mimi, pcm, self.sample_rate, self.device)

    def programme(self, persona: str | None, voice: Voice | None) -> list[PrefillStep]:
        tokens = persona_tokens(self.tokenizer, persona)
        check_fits(self.cfg.lm, self.frame_rate, voice, tokens)
        return system_prompt(self.cfg.lm, self.frame_rate, voice, tokens)

    def open(self, persona: str | None = None, voice: str | Voice | object | None = _DEFAULT) -> None:
        """Restart every slot with the same system prompt, read into all of them at once (no tick)."""
        planned = self.plans.get(persona, voice)[0]
        self.prompts.clear()
        self.live.clear()
        self.lockstep.sampling.set(slice(None), self.sampling)
        for first in range(0, self.slots, OPEN_ROWS):  # a few rows at a time: the prompt's attention
            self._read_prompt(slice(first, first + OPEN_ROWS), _Prompt(planned), planned.positions)

    def start(self, slot: int, persona: str | None = None, voice: str | Voice | object | None = _DEFAULT,
              seed: int | None = None) -> None:
        """A new conversation in `slot`: its history is forgotten and its system prompt is read before the
        next ticks (`prefilling` until then); `seed` makes it reproducible (default: the engine's)."""
        self._check_slot(slot)
        planned, key = self.plans.get(persona, voice)  # (kept for a persona and voice seen before: plans.py)
        sampling = self.sampling if seed is None else replace(self.sampling, seed=seed).checked()
        self.release(slot)
        self.lockstep.sampling.set(slot, sampling)
        if self.read_prompts.restore(key, planned, slot):  # read before: copied in, it listens at once
            self._listen(slice(slot, slot + 1), planned)
        else:
            self.prompts[slot] = _Prompt(planned, key=key)

    def release(self, slot: int) -> None:
        """The conversation in `slot` ends: the slot stops and waits, fresh, for the next one."""
        self._check_slot(slot)
        self.prompts.pop(slot, None)
        self.live.discard(slot)
        self._set_rows(slot, False)
        self.lockstep.reset(self.rows(slot))  # at position -1 it costs nothing to the tick's attention

    def prefilling(self, slot: int) -> bool:  # still reading its system prompt
        return slot in self.prompts

    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.slots:
            raise RequestError(f"slot must be in 0..{self.slots - 1}; got {slot!r}")

    def _set_rows(self, rows: int | slice, live: bool) -> None:
        """Whether `rows` advance with the ticks and speak (device flags, no host sync)."""
        self.lockstep.active[rows] = live
        self.ticks.speaking[rows] = live

    @torch.no_grad()
    def _read_prompt(self, rows: int | slice, prompt: _Prompt, positions: int) -> None:
        """Read up to `positions` more positions of a system prompt into `rows`; when it is all read, the
        rows take its staging ring, their Mimi streams restart and they are live."""
        span = rows if isinstance(rows, slice) else slice(rows, rows + 1)
        span = slice(*span.indices(self.slots))
        planned = prompt.plan
        if prompt.read == 0:
            self._set_rows(span, False)
            self.lockstep.reset(self.rows(*range(self.slots)[span]))
        stop = min(planned.positions, prompt.read + positions)
        reader = self.reader if span.stop - span.start == 1 else None  # one slot: by graphs, in the scratch row
        for start in range(prompt.read, stop, PROMPT_CHUNK):
            end = min(start + PROMPT_CHUNK, stop)
            if reader is None:
                self.lockstep.prefill(span, planned, start, end)
            else:
                reader.read(planned, start, end)
        prompt.read = stop
        if stop < planned.positions:
            return
        if reader is not None:  # read in the scratch row: the slot takes it
            reader.copy_to(span.start)
        if prompt.key is not None:
            self.read_prompts.keep(prompt.key, planned, span.start)
        self._listen(span, planned)

    def _copy_read_prompts(self) -> None:
        """Waiting prompts read by another slot since (the same persona and voice) are copied in, at
        most COPIES_PER_TICK a tick (~130 launches each; the talking wait for the tick)."""
        copied = 0
        for slot, prompt in list(self.prompts.items()):
            if copied == COPIES_PER_TICK:
                break
            if (key := self._kept(prompt)) is not None:
                copied += 1
                self.read_prompts.restore(key, prompt.plan, slot)
                del self.prompts[slot]
                self._listen(slice(slot, slot + 1), prompt.plan)

    def _kept(self, prompt: _Prompt) -> bytes | None:  # the key of a waiting prompt another slot has read
        return prompt.key if prompt.read == 0 and prompt.key and self.read_prompts.has(prompt.key) else None

    def _listen(self, span: slice, planned: Plan) -> None:
        """The slots `span` have read `planned`: they take its staging ring, their Mimi streams restart,
        they are live."""
        self.lockstep.finish(span, planned)
        self.mimi.reset_streams(self.rows(*range(self.slots)[span]))
        self._set_rows(span, True)
        self.live.update(range(self.slots)[span])

    # -- ticks ------------------------------------------------------------------------------

    @property
    def bucket(self) -> int:
        """The slots a tick runs: the smallest bucket holding every slot in use."""
        used = max([*self.live, *self.prompts], default=0) + 1
        return next(b for b in self.ticks.buckets if b >= used)

    def step(self, pcm: NDArray[np.floating[Any]], hearing: Collection[int] | None = None) -> list[Frame | None]:
        """One tick from user audio [B, frame_size] (or [frame_size] with one slot), floats in [-1, 1].
        With `hearing`, only those of the live slots move on (their frames are returned); the other
        slots keep their place, streams and step, as if the tick had not run for them."""
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim == 1 and self.slots == 1:
            pcm = pcm[None]
        if pcm.shape != (self.slots, self.frame_size):
            raise RequestError(f"expected {self.slots} user frame(s) of {self.frame_size} samples "
                               f"({self.frame_size / self.sample_rate * 1000:.0f} ms at {self.sample_rate} Hz); "
                               f"got an array of shape {pcm.shape}")
        if not np.isfinite(pcm).all():
            raise RequestError("user audio holds non-finite samples")
        return self._tick(pcm, None, hearing)

    def step_codes(self, codes: NDArray[np.integer[Any]]) -> list[Frame | None]:
        """One tick from precomputed user codes [B, codebooks] (golden replays skip the encoder)."""
        n = self.cfg.lm.codebooks
        if not isinstance(codes, np.ndarray) or codes.shape != (self.slots, n) \
                or not np.issubdtype(codes.dtype, np.integer):
            got = f"{codes.shape} {codes.dtype}" if isinstance(codes, np.ndarray) else type(codes).__name__
            raise RequestError(f"expected user codes of shape ({self.slots}, {n}) as integers; got {got}")
        if ((codes < 0) | (codes >= self.cfg.lm.card)).any():
            raise RequestError(f"user codes must be in 0..{self.cfg.lm.card - 1}")
        return self._tick(None, torch.from_numpy(codes.astype(np.int64)))

    @torch.no_grad()
    def _tick(self, pcm: NDArray[np.float32] | None, codes: torch.Tensor | None,
              hearing: Collection[int] | None = None) -> list[Frame | None]:
        started = time.perf_counter()
        prompt_ms = 0.0
        self._copy_read_prompts()  # then one chunk of the oldest waiting prompt not kept (those are copied)
        waiting = next(((slot, prompt) for slot, prompt in self.prompts.items() if self._kept(prompt) is None), None)
        if waiting is not None:
            slot, prompt = waiting
            self._read_prompt(slot, prompt, PROMPT_CHUNK)
            if slot in self.live:
                del self.prompts[slot]
            prompt_ms = (time.perf_counter() - started) * 1000
        n = self.bucket
        moving = sorted(self.live if hearing is None else self.live.intersection(hearing))
        if not moving:  # nobody moves on: the tick would change no state, so it does not run (a prompt chunk alone)
            self.timings = {"prompt_ms": prompt_ms, "bucket": 0.0, "tick_ms": (time.perf_counter() - started) * 1000}
            return [None] * self.slots
        self.moving[:] = False
        self.moving[moving] = True
        self.lockstep.active.copy_(self.moving_host, non_blocking=True)  # the rows this tick moves on
        out_pcm, out_tokens, timings = self.ticks.run(None if pcm is None else pcm[:n], n,
                                                      None if codes is None else codes[:n])
        frames: list[Frame | None] = [None] * self.slots
        for b in moving:
            tokens = out_tokens[b].copy()  # [K]
            frames[b] = Frame(pcm=out_pcm[b].copy(), text=self.text_piece(int(tokens[0])), tokens=tokens)
        self.timings = {**timings, "prompt_ms": prompt_ms, "bucket": float(n),
                        "tick_ms": (time.perf_counter() - started) * 1000}
        return frames

    def text_piece(self, token: int) -> str | None:
        """The piece of a sampled text token; None for EPAD, PAD, ids past the vocabulary, control pieces
        and the `<system>` tag."""
        if token in (EPAD_TOKEN, PAD_TOKEN) or token >= min(self.cfg.lm.text_card, self.tokenizer.vocab_size()):
            return None
        if self.tokenizer.is_control(token):  # <s>, </s>: never text
            return None
        piece = self.tokenizer.id_to_piece(token)
        if piece == SYSTEM_TAG:  # the persona's delimiter (a user-defined piece): never said aloud
            return None
        return piece.replace("\u2581", " ")

    def record_voice(self, pcm: NDArray[np.floating[Any]], name: str = "recorded") -> Voice:
        """A voice bundle from a clip, as the reference saves one (voices.py `record_voice`)."""
        return record_voice(self.cfg.lm, self.lockstep.temporal, self.voice_frames(pcm), self.frame_rate, name)

    def rows(self, *slots: int) -> torch.Tensor:
        """bool [B] marking `slots`: the rows argument of `reset_streams`."""
        mask = torch.zeros(self.slots, dtype=torch.bool)
        mask[list(slots)] = True
        return to_device(mask, self.device)

    def memory(self) -> dict[str, float]:
        """GiB of state per conversation (Helium's key/value rings, Mimi's streams) and of the weights."""
        gib, lockstep = 2 ** 30, self.lockstep
        kv = sum(ring.stream_bytes() for ring in lockstep.temporal.rings())
        weights = sum(p.nbytes for m in (lockstep.temporal, lockstep.depformer, self.mimi) for p in m.parameters())
        return {"kv_gib_per_conversation": kv / gib, "mimi_gib_per_conversation": stream_bytes(self.mimi) / gib,
                "weights_gib": weights / gib}

    def close(self) -> None:
        """Free this engine's device state (graphs, rings, buffers): a bench frees each size before the next."""
        self.ticks.close()
        self.reader = None  # its graphs and their pool go with it (gc below)
        for module in (self.lockstep.temporal, self.lockstep.depformer, self.mimi):
            module.setup_streams(0)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def check_slots(slots: int) -> None:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise RequestError(f"slots must be an integer >= 1; got {slots!r}")

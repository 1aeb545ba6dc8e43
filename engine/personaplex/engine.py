"""The PersonaPlex engine: B conversation slots that listen and speak together, 80 ms a tick.

    engine = PersonaPlex.load("DIR")                   # or None: the tiny demo checkpoint
    engine.open(persona="You are ...", voice="NATF2")  # every slot gets this system prompt
    frames = engine.step(user_pcm)                     # [B, 1920] float -> per slot Frame | None
    engine.start(slot, persona, voice)                 # restart one slot while the others talk
    frames = engine.step_codes(user_codes)             # golden replay from precomputed codes

Design choices:
- One thread owns an engine. A tick is: Mimi-encode every slot's user frame, one lockstep
  tick (lockstep.py), Mimi-decode the agent codes of the slots that speak. Slots in their
  system prompt or warm-up get the silence codes before the batched decode (their agent
  rows may hold the initial token, which is out of range for the codebooks) and no Frame;
  a slot's Mimi streams restart when its system prompt ends, as the reference resets
  Mimi after the prompt.
- A slot's system prompt is a queue of prefill ticks (prompt.py) consumed one per tick,
  so starting a slot never stalls the others. `open` runs every slot's prompt at once
  without Mimi work.
- Text pieces: EPAD (0) and PAD (3) are hidden (PP-server), and so are SentencePiece's
  control pieces (`<s>`, `</s>`) and the persona's `<system>` tag (a user-defined piece the
  model can sample, but never says); "▁" becomes a space.
- `record_voice` makes a voice bundle from a clip the way the reference saves one
  (voices.py), on a cold-started lockstep (it restarts every slot).
- No checkpoint means the tiny demo (tiny.py), written on first use; the device and the
  model dtype are engine/device.py's, as for Drama 3.
- Audio and codes cross the engine's boundary as numpy (user PCM in, `Frame.pcm` float32
  and `Frame.tokens` out, `step_codes`' codes in); torch stays inside. A `Voice` is the
  engine's own object: callers get one from `voice` or `clip_voice` and pass it back.
- Random draws come from the engine's own generator (`Sampling.seed`), greedy when asked.
- On CUDA the lockstep's model step and Mimi's encode and decode are captured CUDA graphs
  (engine/graphs.py) replayed every tick; the host bookkeeping between them is eager.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from engine.checkpoints import resolve_checkpoint
from engine.device import model_dtype, pick_device
from engine.errors import RequestError
from engine.graphs import StepGraphs
from engine.personaplex.checkpoint import HUB_PATTERNS, load_lm, load_mimi, load_tokenizer, read_config, voices_dir
from engine.personaplex.config import EPAD_TOKEN, PAD_TOKEN, PersonaPlexConfig
from engine.personaplex.lockstep import Lockstep
from engine.personaplex.mimi import Mimi
from engine.personaplex.prompt import (
    SYSTEM_TAG,
    PrefillStep,
    TextTokenizer,
    Voice,
    check_fits,
    persona_tokens,
    system_prompt,
)
from engine.personaplex.sampling import Sampling, sample_token
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

DEFAULT_VOICE = "NATF2"  # vllm-omni's default; the tiny checkpoint ships it
DEFAULT_PERSONA = ("You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
                   "engaging way.")  # PP-offline's default --text-prompt
_DEFAULT = object()
MAX_CLIP_SECONDS = 30.0  # a voice clip given as audio (the released voices are prompts of a few seconds)


@dataclass
class Frame:
    pcm: NDArray[np.float32]  # [frame_size], the agent's audio for this tick
    text: str | None  # the agent's text piece, None for padding
    tokens: NDArray[np.int64]  # [K] the de-delayed tokens: text, agent codes, user codes


class CodecSteps:
    """Mimi encode and decode of all slots on static buffers, each captured as a CUDA graph on the GPU.

    Capturing runs a step a few times, which would advance the streams: their state is
    saved before and put back after, so the first real step continues where it should.
    """

    def __init__(self, mimi: Mimi, slots: int, device: torch.device, graphs: bool):
        n, size = mimi.codebooks, mimi.frame_size
        self.mimi = mimi
        self.pcm_in = torch.zeros(slots, size, device=device)
        self.codes_out = torch.zeros(slots, n, dtype=torch.long, device=device)
        self.codes_in = torch.zeros(slots, n, dtype=torch.long, device=device)
        self.pcm_out = torch.zeros(slots, size, device=device)
        enabled = graphs and device.type == "cuda"
        self.encoder = StepGraphs(lambda _: self.codes_out.copy_(mimi.encode(self.pcm_in)), [0], enabled=enabled)
        self.decoder = StepGraphs(lambda _: self.pcm_out.copy_(mimi.decode(self.codes_in)), [0], enabled=enabled)

    def _run(self, step: StepGraphs) -> None:
        if step.enabled and not step.graphs:
            state = [b.clone() for b in self.mimi.buffers()]
            step.capture()
            for buffer, saved in zip(self.mimi.buffers(), state):
                buffer.copy_(saved)
        step(0)

    def encode(self, pcm: torch.Tensor) -> torch.Tensor:
        """pcm [B, frame_size] -> codes [B, codebooks]."""
        self.pcm_in.copy_(pcm)
        self._run(self.encoder)
        return self.codes_out.clone()

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, codebooks] (valid codes) -> pcm [B, frame_size]."""
        self.codes_in.copy_(codes)
        self._run(self.decoder)
        return self.pcm_out.clone()


class PersonaPlex:
    name = "personaplex"

    def __init__(self, root: Path, cfg: PersonaPlexConfig, lockstep: Lockstep, mimi: Mimi, tokenizer: TextTokenizer,
                 device: torch.device, sampling: Sampling) -> None:
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
        self.queues: list[deque[PrefillStep]] = [deque() for _ in range(self.slots)]
        self.silence = torch.tensor(cfg.lm.silence_tokens, device=device)
        self.timings: dict[str, float] = {}
        self.generator: torch.Generator | None = None
        self.sampling = Sampling()
        self.set_sampling(sampling)
        mimi.setup_streams(self.slots)
        self.codec = CodecSteps(mimi, self.slots, device, graphs=lockstep.use_graphs)

    @staticmethod
    def load(checkpoint: str | Path | None = None, device: str = "auto", slots: int = 1,
             sampling: Sampling | None = None, graphs: bool = True) -> PersonaPlex:
        """`graphs`: replay CUDA graphs on a GPU (ignored on CPU)."""
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise RequestError(f"slots must be an integer >= 1; got {slots!r}")
        dev = pick_device(device)
        root = demo_checkpoint() if checkpoint is None else resolve_checkpoint(checkpoint, HUB_PATTERNS)
        cfg = read_config(root)
        temporal, depformer = load_lm(root, cfg, dev, model_dtype(dev))
        lockstep = Lockstep(cfg.lm, temporal, depformer, slots, dev, graphs=graphs)
        return PersonaPlex(root, cfg, lockstep, load_mimi(root, cfg, dev), load_tokenizer(root, cfg), dev,
                           sampling or Sampling())

    @property
    def limits(self) -> dict[str, int]:
        return {"context_frames": self.cfg.lm.context, "slots": self.slots, "frame_size": self.frame_size,
                "sample_rate": self.sample_rate}

    def set_sampling(self, sampling: Sampling) -> None:
        self.sampling = sampling.checked()
        self.generator = None
        if not sampling.greedy:
            self.generator = torch.Generator(self.device)
            self.generator.manual_seed(sampling.seed if sampling.seed is not None else int(torch.seed() % 2 ** 62))
        self._install_samplers()

    def _install_samplers(self) -> None:
        s, gen = self.sampling, self.generator
        self.lockstep.set_samplers(lambda logits: sample_token(logits, s.text_temperature, s.text_top_k, gen),
                                   lambda logits: sample_token(logits, s.audio_temperature, s.audio_top_k, gen),
                                   gen)

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
        """Restart every slot and run the same system prompt on all of them (batched, no Mimi work)."""
        steps = self.programme(persona, self.voice(voice))
        self.lockstep.cold_start()
        self.queues = [deque(steps) for _ in range(self.slots)]
        idle = torch.zeros(self.slots, self.cfg.lm.codebooks, dtype=torch.long, device=self.device)
        while any(self.queues):
            self._tick(idle)

    def start(self, slot: int, persona: str | None = None, voice: str | Voice | object | None = _DEFAULT) -> None:
        """Restart one slot: its history is forgotten and its system prompt runs in the next ticks."""
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.slots:
            raise RequestError(f"slot must be in 0..{self.slots - 1}; got {slot!r}")
        steps = self.programme(persona, self.voice(voice))
        self.lockstep.reset_streams(self.rows(slot))
        self.queues[slot] = deque(steps)

    def prefilling(self, slot: int) -> bool:
        return bool(self.queues[slot])

    # -- ticks ------------------------------------------------------------------------------

    def step(self, pcm: NDArray[np.floating[Any]]) -> list[Frame | None]:
        """One tick from user audio [B, frame_size] (or [frame_size] with one slot), floats in [-1, 1]."""
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim == 1 and self.slots == 1:
            pcm = pcm[None]
        if pcm.shape != (self.slots, self.frame_size):
            raise RequestError(f"expected {self.slots} user frame(s) of {self.frame_size} samples "
                               f"({self.frame_size / self.sample_rate * 1000:.0f} ms at {self.sample_rate} Hz); "
                               f"got an array of shape {pcm.shape}")
        if not np.isfinite(pcm).all():
            raise RequestError("user audio holds non-finite samples")
        start = time.perf_counter()
        codes = self.codec.encode(torch.from_numpy(pcm).to(self.device))
        self.timings = {"encode_ms": (time.perf_counter() - start) * 1000}
        return self._tick(codes)

    def step_codes(self, codes: NDArray[np.integer[Any]]) -> list[Frame | None]:
        """One tick from precomputed user codes [B, codebooks] (golden replays skip the encoder)."""
        n = self.cfg.lm.codebooks
        if not isinstance(codes, np.ndarray) or codes.shape != (self.slots, n) \
                or not np.issubdtype(codes.dtype, np.integer):
            got = f"{codes.shape} {codes.dtype}" if isinstance(codes, np.ndarray) else type(codes).__name__
            raise RequestError(f"expected user codes of shape ({self.slots}, {n}) as integers; got {got}")
        if ((codes < 0) | (codes >= self.cfg.lm.card)).any():
            raise RequestError(f"user codes must be in 0..{self.cfg.lm.card - 1}")
        self.timings = {"encode_ms": 0.0}
        return self._tick(torch.tensor(codes, dtype=torch.long, device=self.device))

    @torch.no_grad()
    def _tick(self, codes: torch.Tensor) -> list[Frame | None]:
        start = time.perf_counter()
        steps = [queue.popleft() if queue else None for queue in self.queues]
        out = self.lockstep.tick(codes, steps)
        model_ms = (time.perf_counter() - start) * 1000
        speaking = [out.ran and out.ready[b] and steps[b] is None for b in range(self.slots)]
        frames: list[Frame | None] = [None] * self.slots
        if any(speaking) and out.tokens is not None:
            n = self.cfg.lm.codebooks
            quiet = torch.tensor([not s for s in speaking], device=self.device)[:, None]
            agent = torch.where(quiet, self.silence[None], out.tokens[:, 1:1 + n])  # [B, n]
            pcm = self.codec.decode(agent).cpu().numpy()  # [B, frame_size]
            tokens = out.tokens.cpu().numpy()  # [B, K]
            for b in np.flatnonzero(speaking):
                frames[b] = Frame(pcm=pcm[b], text=self.text_piece(int(tokens[b, 0])), tokens=tokens[b])
        finished = [steps[b] is not None and not self.queues[b] for b in range(self.slots)]
        if any(finished):
            self.mimi.reset_streams(torch.tensor(finished, device=self.device))
        total = (time.perf_counter() - start) * 1000
        self.timings |= {"model_ms": model_ms, "decode_ms": total - model_ms,
                         "tick_ms": total + self.timings.get("encode_ms", 0.0)}
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
        """A voice bundle from a clip, as the reference saves one (voices.py `record_voice`).

        Restarts every slot: call `open` afterwards.
        """
        self.queues = [deque() for _ in range(self.slots)]
        return record_voice(self.lockstep, self.voice_frames(pcm), self.frame_rate, name)

    def rows(self, *slots: int) -> torch.Tensor:
        """bool [B] marking `slots`: the rows argument of `reset_streams`."""
        mask = torch.zeros(self.slots, dtype=torch.bool, device=self.device)
        mask[list(slots)] = True
        return mask

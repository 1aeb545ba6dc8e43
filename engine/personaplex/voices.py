"""Voice prompts: stored `.pt` bundles and raw audio clips.

Design choices:
- A bundle is the reference's `torch.save({"embeddings": [T, 1, 1, D], "cache": [1, K, CT]})`
  (PP-lm `_step_voice_prompt_core` with `save_voice_prompt_embeddings`): the summed input
  embedding of each voice tick and the staging cache right after them. Bundles are found
  by name in the checkpoint's `voices/` (`NATF2` or `NATF2.pt`) or given as a path, and
  checked against the model's sizes.
- A raw clip takes the reference's path: read, mono, resampled to 24 kHz, loudness-
  normalised to -24 LUFS (ITU-R BS.1770 integrated loudness, as pyloudnorm computes it:
  K-weighting, 400 ms blocks with 75 % overlap, absolute and relative gates), cut into
  frames (the last zero-padded), then Mimi-encoded on a fresh stream (`clip_codes`).
- `record_voice` makes a bundle from a clip's codes the way the reference saves one:
  the voice ticks of a fresh stream's system prompt (planned: no slot is touched).
- Every problem a user can cause is a `RequestError` that says what to change.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from engine.errors import RequestError
from engine.personaplex.config import LMConfig
from engine.personaplex.mimi import Mimi
from engine.personaplex.prompt import Voice, plan, system_prompt
from engine.personaplex.temporal import Temporal

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
TARGET_LUFS = -24.0
BLOCK_SECONDS = 0.4
BLOCK_OVERLAP = 0.75


def list_voices(folder: Path | None) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.pt")) if folder is not None else []


def find_voice(folder: Path | None, name: str) -> Path:
    """A bundle name from `voices/`, or an existing path to a `.pt` bundle or an audio clip."""
    path = Path(name).expanduser()
    if path.suffix.lower() in (".pt", *AUDIO_SUFFIXES) and path.is_file():
        return path
    stem = name[:-3] if name.endswith(".pt") else name
    if folder is not None and "/" not in stem and (folder / f"{stem}.pt").is_file():
        return folder / f"{stem}.pt"
    known = ", ".join(list_voices(folder)) or "none in this checkpoint"
    raise RequestError(f"unknown voice {name!r}: give one of the checkpoint's voices ({known}), "
                       f"or a path to a .pt voice bundle or an audio file ({', '.join(AUDIO_SUFFIXES)})")


def load_bundle(path: Path, cfg: LMConfig, device: torch.device | str = "cpu") -> Voice:
    """A stored voice bundle, checked against the model's sizes, its tensors on `device`."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch.load raises many types for a bad file: one answer
        raise RequestError(f"cannot read voice bundle {path.name}: {error}") from None
    if not isinstance(state, dict) or "embeddings" not in state or "cache" not in state:
        raise RequestError(f"voice bundle {path.name} must hold 'embeddings' and 'cache' tensors")
    embeddings, cache = state["embeddings"], state["cache"]
    K, CT = cfg.rows, cfg.ring_columns
    if not isinstance(embeddings, torch.Tensor) or embeddings.dim() < 2 or embeddings.shape[-1] != cfg.dim \
            or embeddings[0].numel() != cfg.dim:
        raise RequestError(f"voice bundle {path.name}: embeddings must be [T, 1, 1, {cfg.dim}] for this model; got "
                           f"{tuple(getattr(embeddings, 'shape', ()))}")
    if not isinstance(cache, torch.Tensor) or cache.numel() != K * CT:
        raise RequestError(f"voice bundle {path.name}: cache must be [1, {K}, {CT}]; got "
                           f"{tuple(getattr(cache, 'shape', ()))}")
    cache = cache.reshape(K, CT).long()
    limits = torch.tensor([cfg.text_card] + [cfg.card] * cfg.n_q)
    if ((cache < 0) | (cache > limits[:, None])).any():
        raise RequestError(f"voice bundle {path.name}: cache holds tokens outside this model's vocabularies")
    return Voice(name=path.stem, embeddings=embeddings.reshape(-1, cfg.dim).float().to(device), cache=cache.to(device))


def save_voice_bundle(voice: Voice, path: Path) -> None:
    assert voice.embeddings is not None and voice.cache is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"embeddings": voice.embeddings[:, None, None, :].contiguous().cpu(),
                "cache": voice.cache[None].contiguous().cpu()}, path)


def read_audio(source: Path | bytes, sample_rate: int) -> NDArray[np.float32]:
    """An audio file (path or bytes) -> mono float32 at `sample_rate`."""
    import soundfile

    try:
        data, rate = soundfile.read(io.BytesIO(source) if isinstance(source, bytes) else str(source),
                                    dtype="float32", always_2d=True)
    except Exception as error:  # noqa: BLE001 - soundfile raises several types for bad input
        name = "the clip" if isinstance(source, bytes) else Path(source).name
        # libsndfile's reason, without soundfile's "Error opening <_io.BytesIO object at 0x...>: " or
        # "Error opening '/server/path': " (neither is the user's business)
        why = re.sub(r"^Error opening .*?: (?=[^:]*$)", "", str(error)) or type(error).__name__
        raise RequestError(f"{name} is not a WAV or FLAC file this server can read ({why.rstrip('.')}); "
                           "give a WAV or FLAC file") from None
    mono = data.mean(axis=1)
    if rate != sample_rate:
        import librosa

        mono = librosa.resample(mono, orig_sr=rate, target_sr=sample_rate)
    if not np.isfinite(mono).all():
        raise RequestError("the audio holds non-finite samples")
    return np.ascontiguousarray(mono, dtype=np.float32)


def _biquad(b: list[float], a: list[float], x: NDArray[np.float64]) -> NDArray[np.float64]:
    from scipy.signal import lfilter

    filtered: NDArray[np.float64] = lfilter(np.array(b) / a[0], np.array(a) / a[0], x)
    return filtered


def k_weighted(x: NDArray[np.floating[Any]], rate: int) -> NDArray[np.float64]:
    """BS.1770 K-weighting: a +4 dB high shelf at 1.5 kHz, then a 38 Hz high pass (RBJ biquads)."""
    w0 = 2 * math.pi * 1500.0 / rate
    A, alpha = 10 ** (4.0 / 40), math.sin(w0) / (2 * (1 / math.sqrt(2)))
    c, s = math.cos(w0), 2 * math.sqrt(A) * alpha
    shelf_b = [A * ((A + 1) + (A - 1) * c + s), -2 * A * ((A - 1) + (A + 1) * c), A * ((A + 1) + (A - 1) * c - s)]
    shelf_a = [(A + 1) - (A - 1) * c + s, 2 * ((A - 1) - (A + 1) * c), (A + 1) - (A - 1) * c - s]
    w0 = 2 * math.pi * 38.0 / rate
    c, alpha = math.cos(w0), math.sin(w0) / (2 * 0.5)
    pass_b, pass_a = [(1 + c) / 2, -(1 + c), (1 + c) / 2], [1 + alpha, -2 * c, 1 - alpha]
    return _biquad(pass_b, pass_a, _biquad(shelf_b, shelf_a, x.astype(np.float64)))


def integrated_loudness(x: NDArray[np.floating[Any]], rate: int) -> float:
    """Integrated loudness (LUFS) of mono audio at least one 400 ms block long."""
    y = k_weighted(x, rate)
    seconds = len(x) / rate
    blocks = round((seconds - BLOCK_SECONDS) / (BLOCK_SECONDS * (1 - BLOCK_OVERLAP))) + 1
    power = np.array([np.mean(y[int(BLOCK_SECONDS * j * (1 - BLOCK_OVERLAP) * rate):
                                int(BLOCK_SECONDS * (j * (1 - BLOCK_OVERLAP) + 1) * rate)] ** 2)
                      for j in range(blocks)])
    with np.errstate(divide="ignore"):
        loudness = -0.691 + 10 * np.log10(power)
    gated = power[loudness >= -70.0]
    if gated.size == 0:
        return -math.inf
    relative = -0.691 + 10 * math.log10(gated.mean()) - 10.0
    gated = power[(loudness > relative) & (loudness > -70.0)]
    return -0.691 + 10 * math.log10(gated.mean()) if gated.size else -math.inf


def normalize_loudness(x: NDArray[np.float32], rate: int, target: float = TARGET_LUFS) -> NDArray[np.float32]:
    if len(x) < BLOCK_SECONDS * rate:
        raise RequestError(f"the voice clip is {len(x) / rate:.2f} s long; give at least {BLOCK_SECONDS} s")
    loudness = integrated_loudness(x, rate)
    if not math.isfinite(loudness):
        raise RequestError("the voice clip is silent; give a clip of someone speaking")
    return (x * 10 ** ((target - loudness) / 20)).astype(np.float32)


def frames_of(pcm: NDArray[np.float32], frame_size: int) -> NDArray[np.float32]:
    """pcm [N] -> [ceil(N / frame_size), frame_size], the last frame zero-padded."""
    count = -(-len(pcm) // frame_size)
    out = np.zeros((count, frame_size), dtype=np.float32)
    out.reshape(-1)[:len(pcm)] = pcm
    return out


@torch.no_grad()
def clip_codes(mimi: Mimi, pcm: NDArray[np.floating[Any]], sample_rate: int, device: torch.device) -> torch.Tensor:
    """A voice clip (mono float at `sample_rate`, Mimi's) -> Mimi codes [frames, codebooks], encoded on a
    fresh stream of `mimi` as the reference encodes a voice prompt."""
    frames = frames_of(normalize_loudness(np.asarray(pcm, dtype=np.float32), sample_rate), mimi.frame_size)
    mimi.setup_streams(1)
    return torch.cat([mimi.encode(torch.from_numpy(f)[None].to(device)) for f in frames])


@torch.no_grad()
def record_voice(cfg: LMConfig, temporal: Temporal, codes: torch.Tensor, frame_rate: float, name: str) -> Voice:
    """A voice bundle from a clip's codes [frames, codebooks], as the reference saves one
    (`save_voice_prompt_embeddings`): the model inputs of the voice ticks of a fresh stream, embedded,
    and the staging ring after them (planned, prompt.py: every stream is forced, no model step runs)."""
    steps = system_prompt(cfg, frame_rate, Voice(name, frames=codes), [])[:len(codes)]
    voice = plan(cfg, steps)
    device = temporal.text_linear.weight.device
    embeddings = temporal.embed(voice.inputs.to(device))[:, 0].float()  # [frames - 1, D]
    return Voice(name, embeddings=embeddings, cache=voice.ring.to(device))

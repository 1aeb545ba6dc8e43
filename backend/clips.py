"""Audio clips from clients (voice references, history turns, a conversation's voice), checked
before anything decodes them whole.

    clean, seconds = await checked_clip(data, max_seconds, "references.0.audio")   # RequestError if refused

A client's clip is a compressed file whose size says nothing of what it decodes to: a 1 MB FLAC
can hold ten minutes of 8 channels at 192 kHz (gigabytes of samples). So:
1. the header is read first (`soundfile.info`: rate, channels, length), and a clip whose
   header says it is too long, or does not say, or has an implausible rate or channel count,
   is refused before one sample is decoded;
2. the samples are then decoded in blocks, downmixed block by block, and decoding stops as
   soon as the clip passes `max_seconds` (a header can lie about the length);
3. what passes is handed on as a small mono WAV (float32 samples, the file's own rate): the
   engine reads that instead, so its decoding is bounded by `max_seconds` of one channel.

Design choices:
- It runs on a small pool of worker threads (CLIP_WORKERS), never on the event loop (other
  sockets would stall) nor on an engine thread (every take and conversation would).
- The clean WAV keeps the clip's rate and float32 samples, and the downmix is the engine's
  (the mean of the channels), so the engine's codes for it equal those of the original file.
- Messages say what to change, and never carry a library's internals.
"""

from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine.errors import RequestError

CLIP_WORKERS = 2
MAX_CHANNELS = 8
MIN_RATE, MAX_RATE = 8_000, 192_000
BLOCK_FRAMES = 65_536

_pool = ThreadPoolExecutor(max_workers=CLIP_WORKERS, thread_name_prefix="clips")


async def checked_clip(data: bytes, max_seconds: float, what: str) -> tuple[bytes, float]:
    """The clip as a mono float32 WAV at its own rate, and its length in seconds (at most
    `max_seconds`); RequestError naming `what` if it is not audio or too much of it. Runs on the
    clip workers."""
    return await asyncio.get_running_loop().run_in_executor(_pool, clean_clip, data, max_seconds, what)


def clean_clip(data: bytes, max_seconds: float, what: str) -> tuple[bytes, float]:
    """(On a worker thread.) See checked_clip."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except Exception as error:  # noqa: BLE001 - soundfile raises several types for bad input
        raise RequestError(f"{what} is not a WAV or FLAC file this server can read ({reason(error)}); give a WAV "
                           "or FLAC file") from None
    rate, channels = int(info.samplerate), int(info.channels)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise RequestError(f"{what} has a sample rate of {rate} Hz; send {MIN_RATE // 1000}-{MAX_RATE // 1000} kHz")
    if not 1 <= channels <= MAX_CHANNELS:
        raise RequestError(f"{what} has {channels} channels; send at most {MAX_CHANNELS} (mono is best)")
    limit = int(max_seconds * rate)
    if info.frames >= 2**62:  # libsndfile's "unknown" (a FLAC stream without its total)
        raise RequestError(f"{what} does not say in its header how long it is; send a WAV or FLAC file written "
                           "whole")
    if info.frames > limit:
        raise RequestError(f"{what} is {info.frames / rate:.1f} s long; the limit is {max_seconds:g} s, send a "
                           "shorter clip")
    blocks: list[np.ndarray] = []
    total = 0
    try:
        with sf.SoundFile(io.BytesIO(data)) as clip:
            for block in clip.blocks(blocksize=BLOCK_FRAMES, dtype="float32", always_2d=True):  # [frames, channels]
                total += block.shape[0]
                if total > limit:
                    raise RequestError(f"{what} holds more than {max_seconds:g} s of audio; send a shorter clip")
                blocks.append(block.mean(axis=1, dtype=np.float32))
    except RequestError:
        raise
    except Exception as error:  # noqa: BLE001 - a file that breaks part way
        raise RequestError(f"{what} could not be decoded ({reason(error)}); send a WAV or FLAC clip") from None
    if total == 0:
        raise RequestError(f"{what} holds no samples; send a clip of speech")
    mono = np.concatenate(blocks)  # [total]
    if not np.isfinite(mono).all():
        raise RequestError(f"{what} holds NaN or infinite samples")
    out = io.BytesIO()
    sf.write(out, mono, rate, format="WAV", subtype="FLOAT")
    return out.getvalue(), total / rate


def reason(error: Exception) -> str:
    """libsndfile's reason, without soundfile's "Error opening <_io.BytesIO object at 0x...>: "."""
    return str(error).rpartition(">: ")[2].strip().rstrip(".") or type(error).__name__

"""`retake bench formats`: what each speech API response format costs to encode (backend/audio_formats.py).

Encodes a take-sized signal in the engine's streaming windows (4, 10, 12, 32, then 64 frames of
2048 samples at 44.1 kHz), streamed and whole, and prints per format: encoding time per second
of audio, the bit rate, and the bytes the first window gives (what a streamed response can send
right after the first window). The signal is shaped noise like the demo checkpoint's audio;
the encoders' cost hardly depends on it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from backend.audio_formats import FORMATS, Encoder

HELP = "encoding cost of the speech API's response formats (mp3, opus, aac, flac, wav, pcm)"
RATE, FRAME = 44100, 2048
SCHEDULE = (4, 10, 12, 32)  # then 64 frames a window


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=30.0, help="audio per run (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per format; the fastest is shown (default 3)")


def signal(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    white = rng.standard_normal(int(seconds * RATE) + 64)
    return np.round(np.convolve(white, np.hanning(64) / 8, "valid")[:int(seconds * RATE)] * 8000).astype(np.int16)


def windows(pcm: np.ndarray) -> list[np.ndarray]:
    out, start, index = [], 0, 0
    while start < len(pcm):
        size = (SCHEDULE[index] if index < len(SCHEDULE) else 64) * FRAME
        out.append(pcm[start:start + size])
        start, index = start + size, index + 1
    return out


def run(args: argparse.Namespace) -> int:
    pcm = signal(args.seconds)
    pieces = windows(pcm)
    print(f"{args.seconds:.0f} s of 44.1 kHz mono in {len(pieces)} windows, fastest of {args.repeats}")
    print(f"{'format':8}{'streamed ms/s':>15}{'whole ms/s':>12}{'kb/s':>8}{'first window bytes':>20}")
    for name in FORMATS:
        best = {True: float("inf"), False: float("inf")}
        size = first = 0
        for _ in range(args.repeats):
            for streamed in (True, False):
                started = time.perf_counter()
                encoder = Encoder(name, RATE, streamed=streamed)
                chunks = [encoder.write(window) for window in pieces] + [encoder.close()]
                best[streamed] = min(best[streamed], time.perf_counter() - started)
                if streamed:
                    size, first = sum(map(len, chunks)), len(chunks[0])
        print(f"{name:8}{1000 * best[True] / args.seconds:>15.2f}{1000 * best[False] / args.seconds:>12.2f}"
              f"{8 * size / args.seconds / 1000:>8.0f}{first:>20}")
    return 0

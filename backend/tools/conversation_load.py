"""The conversation load test behind `retake loadtest --converse`: N live conversations at once,
each a user talking in real time.

Each conversation opens `/converse`, waits for `listening`, then sends one 80 ms frame of
user audio every 80 ms (on an absolute schedule, as a microphone does) for `--seconds`, and
measures on the client:

- latency: from sending user frame k to receiving agent frame k (the server ticks on the
  user's audio, so this is the tick's round trip: queueing, the batched tick, the network);
- longest gap: a player that starts at the first agent frame and plays each for 80 ms stalls
  whenever the next has not arrived (`longest_stall`, as the directing load test measures);
  0 means the agent kept real time.

It prints the system prompt time and p50 / p95 / p99 / max of both over all conversations,
and how many conversations kept real time (no stall above 100 ms).

Design choices:
- The user audio is made here (`user_voice`: a wobbling tone with noise), so the test needs
  no recording; the tests use the same voice.
- Frames go out on an absolute 80 ms schedule: a late send does not push the later ones
  back, as with a microphone.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np

from backend.tools.loadtest import longest_stall, percentiles
from backend.transport import unpack_audio_frame


@dataclass(frozen=True)
class TalkStats:
    conversation: int
    prompt_s: float  # converse.open sent -> listening
    latencies_s: list[float]  # per tick: user frame sent -> agent frame received
    longest_gap_s: float


def user_voice(seconds: float, sample_rate: int, seed: int = 0) -> np.ndarray:
    """int16 [seconds * sample_rate]: a wobbling tone with noise, like a voice in the microphone."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    noise = np.random.default_rng(seed).normal(0, 0.05, t.shape)
    return np.round((0.3 * np.sin(2 * np.pi * (180 + 40 * np.sin(3 * t)) * t) + noise) * 32767).astype(np.int16)


def user_frames(seconds: float, frame_samples: int, sample_rate: int, seed: int) -> list[bytes]:
    """user_voice as PCM16 frames of one tick each (a last partial frame is left out)."""
    pcm = user_voice(seconds, sample_rate, seed).astype("<i2")
    return [pcm[k: k + frame_samples].tobytes() for k in range(0, len(pcm) - frame_samples + 1, frame_samples)]


async def talk(index: int, url: str, seconds: float, stagger_s: float, token: str | None) -> TalkStats:
    import websockets

    await asyncio.sleep(index * stagger_s)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with websockets.connect(url, max_size=None, additional_headers=headers) as socket:
        opened = time.monotonic()
        await socket.send(json.dumps({"type": "converse.open"}))
        ready = json.loads(await socket.recv())
        if ready.get("type") != "converse.ready":
            raise RuntimeError(f"{ready.get('code')}: {ready.get('message')}")
        while json.loads(await socket.recv()).get("type") != "converse.listening":
            pass
        prompt_s = time.monotonic() - opened
        frame_samples, rate = int(ready["frame_samples"]), int(ready["sample_rate"])
        frames = user_frames(seconds, frame_samples, rate, seed=index)
        tick_s = frame_samples / rate
        sent: list[float] = []
        arrived: list[float] = []

        async def send() -> None:
            start = time.monotonic()
            for k, frame in enumerate(frames):
                await asyncio.sleep(max(0.0, start + k * tick_s - time.monotonic()))
                sent.append(time.monotonic())
                await socket.send(frame)

        async def receive() -> None:
            while len(arrived) < len(frames):
                message = await socket.recv()
                if isinstance(message, bytes):
                    header, _ = unpack_audio_frame(message)
                    if header.seq != len(arrived):
                        raise RuntimeError(f"agent frame {header.seq} arrived where {len(arrived)} was due")
                    arrived.append(time.monotonic())
                elif json.loads(message).get("type") == "error":
                    raise RuntimeError(message)

        await asyncio.gather(send(), receive())
    return TalkStats(index, prompt_s, [a - s for s, a in zip(sent, arrived)],
                     longest_stall(arrived, [tick_s] * len(arrived)))


def run(url: str, conversations: int, seconds: float, stagger_ms: float, token: str | None) -> int:
    results: list[TalkStats] = []
    failures: list[str] = []

    async def one(index: int) -> None:
        try:
            results.append(await talk(index, url, seconds, stagger_ms / 1000, token))
        except Exception as error:  # noqa: BLE001 - reported, and the other conversations go on
            failures.append(f"conversation {index}: {type(error).__name__}: {error}")

    async def main() -> float:
        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(conversations)))
        return time.monotonic() - started

    wall = asyncio.run(main())
    latencies = [value for r in results for value in r.latencies_s]
    gaps = [r.longest_gap_s for r in results]
    print(f"{conversations} conversations x {seconds:g} s of talking against {url}: {len(results)} done "
          f"in {wall:.1f} s")
    print(f"{'ms':28} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    print(f"{'system prompt':28} {percentiles([r.prompt_s for r in results])}")
    print(f"{'tick latency':28} {percentiles(latencies)}")
    print(f"{'longest gap vs playback':28} {percentiles(gaps)}")
    print(f"conversations that kept real time (no gap above 100 ms): {sum(g <= 0.1 for g in gaps)} of {len(gaps)}")
    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0

"""The conversation load test behind `retake loadtest --converse`: N live conversations at once,
each a user talking in real time.

Each conversation opens `/converse`, waits for `listening`, streams silence (a microphone in
a quiet room) until every conversation listens, then sends one 80 ms frame of user audio
every 80 ms (on an absolute schedule, as a microphone does) for `--seconds`, so all of them
talk at once, and measures on the client, from the first frame of talk:

- latency: from sending user frame k to receiving agent frame k (the server ticks on the
  user's audio, so this is the tick's round trip: queueing, the batched tick, the network);
- longest gap: a player that starts at the first agent frame and plays each for 80 ms stalls
  whenever the next has not arrived (`longest_stall`, as the directing load test measures);
  0 means the agent kept real time.

It prints the system prompt time and p50 / p95 / p99 / max of both over all conversations,
and how many conversations kept real time (no stall above 100 ms).

With `joins` (`--join N`), N more conversations open one after another while the first ones
talk (the first `join_after_s` after they all listen, then one every `join_every_s`): their
system prompt time (open sent to listening) is a row of its own, and so is the tick latency
of the talking conversations' frames sent while a join's system prompt was being read or in
the frame after it listens, which says whether the others keep their tick. Each joiner opens
with a persona of its own (a friendly teacher's, naming the caller), so its prompt is read
rather than copied from the server's read prompts: the join measured is the costliest.

Design choices:
- The user audio is made here (`user_voice`: a wobbling tone with noise), so the test needs
  no recording; the tests use the same voice.
- Frames go out on an absolute 80 ms schedule: a late send does not push the later ones
  back, as with a microphone. Each conversation's schedule starts at a phase of its own
  within the 80 ms after it listens (`microphone_phase`), as independent microphones do; with
  `aligned` every schedule starts when its conversation listens, so conversations that
  listen at one tick (their prompts copied together) send in the same few milliseconds.
- The client must not be what is measured: one event loop handling 127 sockets' frames in
  the same few milliseconds was a suspect for stop 35's stalls. Conversations are spread over
  client processes (`processes`, by default one per 32 conversations, at most half the
  CPUs; "spawn", as the caller may hold threads), each with its own loop, and every process
  probes its loop while all talk (a 5 ms sleep: how late it wakes, `client event loop lag`):
  a lag near the tick latency's tail says the client, not the server, made it. The processes
  meet at a barrier once all their conversations listen, so all still talk together; the
  joiners open in the first. Their clocks agree (time.monotonic is the system's).
- The first conversations talk together: system prompts are read one before each tick, so
  N opened at once listen over about N ticks, and without waiting the first would be done
  before the last began. Until then each streams silence, as a microphone does, so the
  server's ticks and the client's frames stay paired (agent frame k answers user frame k).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backend.tools.loadtest import longest_stall, percentiles, probe_loop
from backend.transport import unpack_audio_frame


@dataclass(frozen=True)
class TalkStats:
    conversation: int
    opened: float  # when converse.open was sent (monotonic)
    prompt_s: float  # converse.open sent -> listening
    sent: list[float]  # when each user frame was sent (monotonic)
    latencies_s: list[float]  # per tick: user frame sent -> agent frame received
    longest_gap_s: float
    tick_s: float  # one frame of audio
    joined: bool = False  # opened while the others talked


@dataclass(frozen=True)
class Joins:
    """Conversations that open while the others talk (`--join`)."""

    count: int = 0
    after_s: float = 2.0  # after every first conversation listens
    every_s: float = 1.0
    seconds: float = 2.0  # how long each talks

def user_voice(seconds: float, sample_rate: int, seed: int = 0) -> np.ndarray:
    """int16 [seconds * sample_rate]: a wobbling tone with noise, like a voice in the microphone."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    noise = np.random.default_rng(seed).normal(0, 0.05, t.shape)
    return np.round((0.3 * np.sin(2 * np.pi * (180 + 40 * np.sin(3 * t)) * t) + noise) * 32767).astype(np.int16)


def user_frames(seconds: float, frame_samples: int, sample_rate: int, seed: int) -> list[bytes]:
    """user_voice as PCM16 frames of one tick each (a last partial frame is left out)."""
    pcm = user_voice(seconds, sample_rate, seed).astype("<i2")
    return [pcm[k: k + frame_samples].tobytes() for k in range(0, len(pcm) - frame_samples + 1, frame_samples)]


def microphone_phase(index: int) -> float:
    """Where in its 80 ms conversation `index`'s microphone starts, as a fraction of a frame: the
    golden-ratio sequence, spread evenly over the frame for any number of conversations."""
    return (index * 0.6180339887498949) % 1.0


async def talk(index: int, url: str, seconds: float, stagger_s: float, token: str | None,
               listening: asyncio.Event | None = None, joined: bool = False,
               together: Callable[[], Awaitable[object]] | None = None, phase: float = 0.0) -> TalkStats:
    """One conversation; `listening` is set once it listens. With `together`, it streams silence
    from then on (a microphone in a quiet room) until `together()` returns, and only then talks
    for `seconds`: what is measured are the frames from there. Its first frame goes out `phase`
    of a frame after it listens."""
    import websockets

    await asyncio.sleep(index * stagger_s)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with websockets.connect(url, max_size=None, additional_headers=headers) as socket:
        opened = time.monotonic()
        # a joiner's persona is its own, so its system prompt is read (the costly join), not copied
        persona = {"persona": f"You are a friendly teacher talking with caller {index}."} if joined else {}
        await socket.send(json.dumps({"type": "converse.open", **persona}))
        ready = json.loads(await socket.recv())
        if ready.get("type") != "converse.ready":
            raise RuntimeError(f"{ready.get('code')}: {ready.get('message')}")
        while json.loads(await socket.recv()).get("type") != "converse.listening":
            pass
        prompt_s = time.monotonic() - opened
        if listening is not None:
            listening.set()
        frame_samples, rate = int(ready["frame_samples"]), int(ready["sample_rate"])
        frames = user_frames(seconds, frame_samples, rate, seed=index)
        quiet = bytes(2 * frame_samples)
        tick_s = frame_samples / rate
        sent: list[float] = []
        arrived: list[float] = []
        sending = True
        waiting = asyncio.ensure_future(together()) if together is not None else None
        first = 0  # the first measured frame: silence before it

        async def send() -> None:
            nonlocal sending, first
            start = time.monotonic() + phase * tick_s
            k = 0
            while waiting is not None and not waiting.done():  # silence, on the schedule, until all talk
                await asyncio.sleep(max(0.0, start + k * tick_s - time.monotonic()))
                if waiting.done():
                    break
                sent.append(time.monotonic())
                await socket.send(quiet)
                k += 1
            first = k
            for j, frame in enumerate(frames):
                await asyncio.sleep(max(0.0, start + (k + j) * tick_s - time.monotonic()))
                sent.append(time.monotonic())
                await socket.send(frame)
            sending = False

        async def receive() -> None:
            while sending or len(arrived) < len(sent):
                message = await socket.recv()
                if isinstance(message, bytes):
                    header, _ = unpack_audio_frame(message)
                    if header.seq != len(arrived):
                        raise RuntimeError(f"agent frame {header.seq} arrived where {len(arrived)} was due")
                    arrived.append(time.monotonic())
                elif json.loads(message).get("type") == "error":
                    raise RuntimeError(message)

        try:
            await asyncio.gather(send(), receive())
        finally:
            if waiting is not None:
                waiting.cancel()
    sent, arrived = sent[first:], arrived[first:]
    return TalkStats(index, opened, prompt_s, sent, [a - s for s, a in zip(sent, arrived)],
                     longest_stall(arrived, [tick_s] * len(arrived)), tick_s, joined)


@dataclass(frozen=True)
class Plan:
    """What every client process of one load test runs."""

    url: str
    conversations: int
    seconds: float
    stagger_ms: float
    token: str | None
    joins: Joins
    aligned: bool


@dataclass
class Part:
    """One client process's conversations, measured."""

    results: list[TalkStats]
    failures: list[str]
    lags_s: list[float]  # the process's event loop: how late a 5 ms sleep woke, while all talked
    wall_s: float


CONVERSATIONS_PER_PROCESS = 32


def default_processes(conversations: int) -> int:
    """Client processes: one per 32 conversations, at most half the CPUs (the server has the rest)."""
    return max(1, min(-(-conversations // CONVERSATIONS_PER_PROCESS), (os.cpu_count() or 2) // 2))


async def run_conversations(plan: Plan, indices: list[int], joining: list[int],
                            barrier: threading.Barrier | None = None) -> Part:
    """Conversations `indices` and joiners `joining` of the plan in this process. The first ones
    talk together once every one of them listens, in every process (`barrier`: one party per
    process); the joiners open after that."""
    results: list[TalkStats] = []
    failures: list[str] = []
    lags: list[float] = []
    listening = {index: asyncio.Event() for index in indices}
    everyone = asyncio.Event()  # every first conversation of every process listens

    async def all_listen() -> None:
        await asyncio.gather(*(event.wait() for event in listening.values()))
        if barrier is not None:
            await asyncio.get_running_loop().run_in_executor(None, cross, barrier)
        everyone.set()

    async def probe() -> None:  # the client's own lateness: a busy loop delays every frame it handles
        await everyone.wait()
        await probe_loop(lags)

    async def one(index: int, joined: bool = False) -> None:
        try:
            if joined:  # once the others all talk, one after another
                await everyone.wait()
                await asyncio.sleep(plan.joins.after_s + (index - plan.conversations) * plan.joins.every_s)
                results.append(await talk(index, plan.url, plan.joins.seconds, 0.0, plan.token, joined=True))
            else:  # every first conversation talks at once, from when the last of them listens
                results.append(await talk(index, plan.url, plan.seconds, plan.stagger_ms / 1000, plan.token,
                                          listening[index], together=everyone.wait,
                                          phase=0.0 if plan.aligned else microphone_phase(index)))
        except Exception as error:  # noqa: BLE001 - reported, and the other conversations go on
            failures.append(f"conversation {index}: {type(error).__name__}: {error}")
            if not joined:
                listening[index].set()

    started = time.monotonic()
    tasks = [asyncio.ensure_future(all_listen()), asyncio.ensure_future(probe())]
    await asyncio.gather(*(one(i) for i in indices), *(one(j, joined=True) for j in joining))
    everyone.set()  # (no first conversation here)
    tasks[1].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return Part(results, failures, lags, time.monotonic() - started)


def cross(barrier: threading.Barrier) -> None:
    """Wait for every process's conversations to listen (a process that never comes: 10 minutes)."""
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=600)


def run_process(plan: Plan, indices: list[int], joining: list[int], barrier: threading.Barrier,
                out: multiprocessing.Queue[Part]) -> None:
    """A client process: its conversations, its Part into `out`."""
    out.put(asyncio.run(run_conversations(plan, indices, joining, barrier)))


def run_parts(plan: Plan, processes: int) -> list[Part]:
    """Every conversation, in `processes` client processes (the joiners in the first)."""
    everyone = list(range(plan.conversations))
    joining = list(range(plan.conversations, plan.conversations + plan.joins.count))
    if processes == 1:
        return [asyncio.run(run_conversations(plan, everyone, joining))]
    context = multiprocessing.get_context("spawn")  # (not fork: the caller may hold threads)
    barrier = context.Barrier(processes)
    out: multiprocessing.Queue[Part] = context.Queue()
    workers = [context.Process(target=run_process, daemon=True,
                               args=(plan, everyone[p::processes], joining if p == 0 else [], barrier, out))
               for p in range(processes)]
    for worker in workers:
        worker.start()
    parts = []
    for worker in workers:
        try:
            parts.append(out.get(timeout=plan.seconds + plan.conversations * plan.stagger_ms / 1000 + 900))
        except queue.Empty:
            parts.append(Part([], [f"a client process sent nothing (exit code {worker.exitcode})"], [], 0.0))
    for worker in workers:
        worker.join(timeout=10)
    return parts


def run(url: str, conversations: int, seconds: float, stagger_ms: float, token: str | None,
        joins: Joins = Joins(), report: Path | None = None, aligned: bool = False,
        processes: int | None = None) -> int:
    processes = min(conversations, default_processes(conversations) if processes is None else processes)
    parts = run_parts(Plan(url, conversations, seconds, stagger_ms, token, joins, aligned), processes)
    results = [r for part in parts for r in part.results]
    failures = [f for part in parts for f in part.failures]
    lags = [lag for part in parts for lag in part.lags_s]
    wall = max(part.wall_s for part in parts)
    talkers = [r for r in results if not r.joined]
    joiners = [r for r in results if r.joined]
    latencies = [value for r in talkers for value in r.latencies_s]
    gaps = [r.longest_gap_s for r in talkers]
    # from a join's open to a frame after it listens: the read's last chunk can push back the tick
    # after it, and a read of a tick or less would otherwise fall between two frames of the talkers
    windows = [(r.opened, r.opened + r.prompt_s + r.tick_s) for r in joiners]
    during = [value for r in talkers for sent, value in zip(r.sent, r.latencies_s)
              if any(start <= sent <= end for start, end in windows)]
    talking = [r.sent for r in talkers if r.sent]
    together = max(0.0, min(s[-1] for s in talking) - max(s[0] for s in talking)) if talking else 0.0
    print(f"{conversations} conversations x {seconds:g} s of talking against {url}: {len(talkers)} done "
          f"in {wall:.1f} s, all talking at once for {together:.1f} s"
          + (f"; {len(joiners)} of {joins.count} joined while they talked" if joins.count else "")
          + f" ({processes} client process{'es' if processes > 1 else ''})")
    print(f"{'ms':28} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    print(f"{'system prompt':28} {percentiles([r.prompt_s for r in talkers])}")
    print(f"{'tick latency':28} {percentiles(latencies)}")
    print(f"{'longest gap vs playback':28} {percentiles(gaps)}")
    if joins.count:
        print(f"{'system prompt, joining':28} {percentiles([r.prompt_s for r in joiners])}")
        print(f"{'tick latency during joins':28} {percentiles(during)}")
    print(f"{'client event loop lag':28} {percentiles(lags)}")
    print(f"conversations that kept real time (no gap above 100 ms): {sum(g <= 0.1 for g in gaps)} of {len(gaps)}")
    for failure in failures:
        print(f"FAILED {failure}")
    if report is not None:
        report.write_text(json.dumps({
            "conversations": conversations, "seconds": seconds, "wall_s": round(wall, 2),
            "all_talking_s": round(together, 2), "joins": joins.count,
            "prompt_ms": ms([r.prompt_s for r in talkers]), "tick_latency_ms": ms(latencies),
            "longest_gap_ms": ms(gaps), "joining_prompt_ms": ms([r.prompt_s for r in joiners]),
            "tick_latency_during_joins_ms": ms(during), "kept_real_time": sum(g <= 0.1 for g in gaps),
            "aligned": aligned, "processes": processes, "client_loop_lag_ms": ms(lags),
            "failures": failures}, indent=1) + "\n")
    return 1 if failures else 0


def ms(values: list[float]) -> dict[str, float] | None:
    """p50, p95, p99 and max in milliseconds, or None."""
    if not values:
        return None
    p50, p95, p99 = np.percentile(np.array(values), [50, 95, 99])
    return {"p50": round(float(p50) * 1000, 1), "p95": round(float(p95) * 1000, 1),
            "p99": round(float(p99) * 1000, 1), "max": round(max(values) * 1000, 1)}

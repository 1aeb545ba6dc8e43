"""The directing load test behind `retake loadtest --sessions N`: N sessions at once against a running server.

Each session opens a socket, and runs `takes` takes one after another (keeping each, so the
directing history grows as in a real scene). Every take is measured on the client:

- first audio: from sending take.start to the first audio frame arriving; beside it the
  server's own figures from the take entering the engine's queue: to the engine's first
  window (`first audio (server)`), and to that window's frame leaving the server after its
  store write (`first audio (server, sent)`, timings.first_audio_sent_ms);
- queued: the part of that until take.queued arrived: the server storing the take and the
  messages' round trip, before the engine has the take (the server's first-audio figure
  starts after the take is stored);
- longest gap: a player that starts at the first frame and plays each window for its
  duration stalls whenever the next window has not arrived; the longest stall of a take is
  its longest gap relative to playback time (0 when the stream keeps ahead of playback), and
  where in the take it fell (`longest_gap_at_s`: the audio played before it). The report
  counts the gaps above 100 ms by where they fell (the first second of audio: the stream's
  first windows; 1-3 s: its ramp; later) and in which take of the session (the first takes of
  sessions that start together ask at once): where to look on the server.

`listen`: a director hears each take to its end before the next (the player's end, its stalls
included), as in the studio; without it the next take is asked as soon as the last audio
arrives, while the take still plays: a stream that runs ahead of real time then has every
session asking for audio faster than one listener hears it (a saturation test, each
session's takes overlapping in playback). `think_ms` is a director's pause before each take
(reading the next line; after the listening, with `listen`): in it the server
warms the line's prompt into its prefix cache (backend/directing/warming.py), which the
default of 0 (a take asked for at once) leaves no time for. With `script`, each session
first writes its lines into the scene's script (line.set), as a director does in the
studio: the warm then holds the line's text too, and a take of it prefills nothing. Each
take's `cached_rows` (the prompt rows the prefix cache restored) is reported beside its
prompt rows.

It prints p50 / p95 / p99 of these over all takes, the finish reasons, and how many takes had a
gap above 100 ms (sglang-omni's continuity criterion); with a JSON path it writes the raw
numbers too.

Design choices:
- Measured on the client, through the server, as a director would hear it; the server's own
  first-audio figure is printed beside it.
- Sessions run concurrently in one event loop; a failing session is reported and the others
  go on (exit 1 at the end). The loop probes itself while they run (a 5 ms sleep: how late it
  wakes, `client event loop lag`): every arrival it stamps is late by as much, so a lag near
  the gaps' or first audio's tail says the client, not the server, made it.
- The conversation load test (backend/tools/conversation_load.py) measures the same way
  (`longest_stall`, `percentiles`), so the two reports read alike.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from backend.tools.client import Director

LAG_PROBE_S = 0.005  # the event loop probe's sleep (the conversation load test's too)
LINES = ("Places, everyone.", "Who left the lamp burning?", "Not me. I was asleep.", "Then light it again.")


@dataclass(frozen=True)
class LoadTest:
    url: str  # the server's /ws
    sessions: int
    takes: int  # per session, one after another
    max_new_tokens: int
    stagger_ms: float  # between session starts
    keep: bool  # keep each take (a growing history)
    token: str | None
    json: Path | None  # also write every take's numbers here
    think_ms: float = 0.0  # a director's pause before each take
    script: bool = False  # write every line into the session's script first, as the studio does
    listen: bool = False  # hear each take to its end before the next


@dataclass(frozen=True)
class TakeStats:
    session: int
    session_id: str
    take_id: int
    started_s: float  # from the load test's start to this take's take.start
    finish_reason: str
    queued_s: float  # client-side, from take.start to take.queued
    first_audio_s: float | None  # client-side, from take.start to the first frame
    server_first_audio_ms: float | None  # engine-side timings.first_audio_ms + queue_ms
    slot_wait_ms: float | None  # timings.queue_ms: in the engine's queue (every slot taken: until a take ends)
    prefill_ms: float | None  # timings.prefill_ms: from its start in a slot to its prompt prefilled
    first_window_ms: float | None  # first_audio_ms - prefill_ms: its first frames' steps and their vocoding
    server_sent_ms: float | None  # timings.first_audio_sent_ms: the first frame leaving the server, same start
    longest_gap_s: float  # the longest playback stall
    longest_gap_at_s: float  # where it fell: the take's audio played before it (s)
    number: int  # the take's place in its session (0: the first)
    audio_s: float
    wall_s: float
    prompt_rows: int
    cached_rows: int  # of those, restored from the prefix cache
    error: str | None  # the server's `error` of a take that ended with finish_reason "error"
    timings: dict[str, object]  # the server's take.done timings as sent (restore_ms, prefill_chunks, ...)


class Playback(NamedTuple):
    """A take as its client's player hears it."""

    stall: float  # the longest stall (s)
    played: float  # when the player stops playing (the clock of the arrivals)
    stall_at: float  # the audio played before the longest stall (s; 0 without one)


def playback(arrivals: list[float], durations: list[float]) -> Playback:
    """A player that starts at the first arrival and plays windows back to back: its longest
    stall, when it stops playing (0 without any window) and how far into the audio the stall fell."""
    if not arrivals:
        return Playback(0.0, 0.0, 0.0)
    playing_until, stall, stall_at, heard = arrivals[0], 0.0, 0.0, 0.0
    for arrived, duration in zip(arrivals, durations):
        if arrived - playing_until > stall:
            stall, stall_at = arrived - playing_until, heard
        playing_until = max(playing_until, arrived) + duration
        heard += duration
    return Playback(stall, playing_until, stall_at)


def longest_stall(arrivals: list[float], durations: list[float]) -> float:
    """The longest stall of a player that starts at the first arrival and plays windows back to back."""
    return playback(arrivals, durations).stall


async def run_session(index: int, plan: LoadTest, started: float, results: list[TakeStats],
                      failures: list[str]) -> None:
    await asyncio.sleep(index * plan.stagger_ms / 1000)
    try:
        director = await Director.connect(plan.url, token=plan.token)
        ready = await director.open()
        rate = int(str(ready["sample_rate"]))
        texts = [LINES[(index + number) % len(LINES)] for number in range(plan.takes)]
        for number, text in enumerate(texts if plan.script else []):
            await director.request({"type": "line.set", "line_id": f"line-{number}", "text": text}, "script")
        for number, text in enumerate(texts):
            await asyncio.sleep(plan.think_ms / 1000)
            take = await director.take(f"line-{number}", text, sampling={"max_new_tokens": plan.max_new_tokens})
            done = take.done
            arrivals = [frame.arrived for frame in take.frames]
            durations = [len(frame.pcm) / rate for frame in take.frames]
            stall, played, stall_at = playback(arrivals, durations)
            timings = done["timings"] if isinstance(done["timings"], dict) else {}
            server_first, prefill_ms = timings.get("first_audio_ms"), timings.get("prefill_ms")
            results.append(TakeStats(
                session=index, session_id=str(ready["session_id"]), take_id=take.take_id,
                started_s=take.sent - started,
                finish_reason=str(done["finish_reason"]),
                queued_s=take.queued_at - take.sent,
                first_audio_s=arrivals[0] - take.sent if arrivals else None,
                server_first_audio_ms=None if server_first is None else server_first + (timings.get("queue_ms") or 0),
                server_sent_ms=timings.get("first_audio_sent_ms"), slot_wait_ms=timings.get("queue_ms"),
                prefill_ms=prefill_ms,
                first_window_ms=None if server_first is None or prefill_ms is None else server_first - prefill_ms,
                longest_gap_s=stall, longest_gap_at_s=stall_at, number=number, audio_s=sum(durations),
                wall_s=time.monotonic() - take.sent, prompt_rows=int(timings.get("prompt_rows") or 0),
                cached_rows=int(timings.get("cached_rows") or 0),
                error=None if done.get("error") is None else str(done["error"]), timings=dict(timings)))
            if plan.keep and done["finish_reason"] in ("stop", "length") and take.frames:
                await director.request({"type": "take.keep", "take_id": take.take_id}, "history")
            if plan.listen:  # the take heard to its end (the keep went while it played)
                await asyncio.sleep(max(0.0, played - time.monotonic()))
        await director.close()
    except Exception as error:  # noqa: BLE001 - reported, and the other sessions go on
        failures.append(f"session {index}: {type(error).__name__}: {error}")


async def probe_loop(lags: list[float]) -> None:
    """Until cancelled: how late each LAG_PROBE_S sleep of this event loop wakes, into `lags` (s)."""
    while True:
        asked = time.monotonic()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(max(0.0, time.monotonic() - asked - LAG_PROBE_S))


def percentile_values(values: list[float]) -> dict[str, float] | None:
    """p50, p95, p99 and max of values (s), None without any."""
    if not values:
        return None
    p50, p95, p99 = np.percentile(np.array(values), [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": max(values)}


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p95, p99 = np.percentile(np.array(values), [50, 95, 99])
    return f"{p50 * 1000:8.0f} {p95 * 1000:8.0f} {p99 * 1000:8.0f} {max(values) * 1000:8.0f}"


def run(plan: LoadTest) -> int:
    """Run the sessions, print the report; 1 if any session failed."""
    results: list[TakeStats] = []
    failures: list[str] = []
    lags: list[float] = []

    async def main() -> float:
        started = time.monotonic()
        probe = asyncio.ensure_future(probe_loop(lags))
        await asyncio.gather(*(run_session(i, plan, started, results, failures) for i in range(plan.sessions)))
        probe.cancel()
        return time.monotonic() - started

    wall = asyncio.run(main())
    first = [r.first_audio_s for r in results if r.first_audio_s is not None]
    server_first = [r.server_first_audio_ms / 1000 for r in results if r.server_first_audio_ms is not None]
    sent = [r.server_sent_ms / 1000 for r in results if r.server_sent_ms is not None]
    slot_waits = [r.slot_wait_ms / 1000 for r in results if r.slot_wait_ms is not None]
    prefills = [r.prefill_ms / 1000 for r in results if r.prefill_ms is not None and r.first_window_ms is not None]
    first_windows = [r.first_window_ms / 1000 for r in results if r.first_window_ms is not None]
    gaps = [r.longest_gap_s for r in results if r.first_audio_s is not None]
    audio = sum(r.audio_s for r in results)
    print(f"{plan.sessions} sessions x {plan.takes} takes against {plan.url}: {len(results)} takes in {wall:.1f} s, "
          f"{audio:.1f} s of audio ({audio / wall:.2f} s of audio per second)")
    print("finish reasons: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.finish_reason for r in results)
                                                                      .items())))
    for error, count in Counter(r.error for r in results if r.error is not None).most_common():
        print(f"error x{count}: {error}")
    print(f"{'ms':28} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    print(f"{'take.queued (client)':28} {percentiles([r.queued_s for r in results])}")
    print(f"{'first audio (client)':28} {percentiles(first)}")
    print(f"{'first audio (server)':28} {percentiles(server_first)}")
    print(f"{'first audio (server, sent)':28} {percentiles(sent)}")
    print(f"{'waited for a slot (server)':28} {percentiles(slot_waits)}")
    print(f"{'prefill (server)':28} {percentiles(prefills)}")
    print(f"{'first window (server)':28} {percentiles(first_windows)}")
    print(f"{'longest gap vs playback':28} {percentiles(gaps)}")
    print(f"{'client event loop lag':28} {percentiles(lags)}")
    print(f"takes with a gap above 100 ms: {sum(g > 0.1 for g in gaps)} of {len(gaps)}")
    if gapped := [r for r in results if r.first_audio_s is not None and r.longest_gap_s > 0.1]:
        print(f"  where they fell: in the first 1 s of audio {sum(r.longest_gap_at_s < 1 for r in gapped)}, "
              f"1-3 s {sum(1 <= r.longest_gap_at_s < 3 for r in gapped)}, later "
              f"{sum(r.longest_gap_at_s >= 3 for r in gapped)}; in sessions' first takes "
              f"{sum(r.number == 0 for r in gapped)}, later takes {sum(r.number > 0 for r in gapped)}")
    rows, cached = sum(r.prompt_rows for r in results), sum(r.cached_rows for r in results)
    print(f"prompt rows restored from the prefix cache: {cached:,} of {rows:,}"
          + (f" (a {plan.think_ms:g} ms pause before each take)" if plan.think_ms else "")
          + (" (the lines written into the script first)" if plan.script else "")
          + (" (each take heard to its end before the next)" if plan.listen else ""))
    for failure in failures:
        print(f"FAILED {failure}")
    if plan.json:
        plan.json.write_text(json.dumps({"sessions": plan.sessions, "takes_per_session": plan.takes, "wall_s": wall,
                                         "failures": failures,
                                         "client_loop_lag_s": percentile_values(lags),
                                         "takes": [asdict(r) for r in results]}, indent=1))
    return 1 if failures else 0

"""The resume load test behind `retake loadtest --resume`: how many sessions per second reconnect
and resume (through a balancer, or straight to one server).

First `sessions` scenes are made, each with `takes` kept takes (short ones: the scene's size,
not the engine, is what a resume reads). Then each scene is resumed `resumes` times over, all
scenes at once, as a client does after losing its socket: a new WebSocket, `session.open` with
the scene's id, and the whole `session.ready` (script, takes, history) read, then close. It
prints resumes per second over the whole run and the p50 / p95 / p99 of one resume, measured
from the connect to the last byte of `session.ready`; with `--url` on HAProxy (deploy/), each
resume is a new connection the balancer places on any replica.
"""

from __future__ import annotations

import asyncio
import time

from backend.tools.client import Director
from backend.tools.loadtest import LINES, percentiles


async def make_scene(url: str, takes: int, token: str | None) -> str:
    director = await Director.connect(url, token=token)
    session_id = str((await director.open())["session_id"])
    for number in range(takes):
        take = await director.take(f"line-{number}", LINES[number % len(LINES)], sampling={"max_new_tokens": 8})
        if take.done["finish_reason"] in ("stop", "length") and take.frames:
            await director.request({"type": "take.keep", "take_id": take.take_id}, "history")
    await director.close()
    return session_id


async def resume(url: str, session_id: str, takes: int, token: str | None) -> float:
    """One reconnect and resume; its seconds."""
    started = time.monotonic()
    director = await Director.connect(url, token=token)
    ready = await director.open(session_id)
    elapsed = time.monotonic() - started
    await director.close()
    found = ready.get("takes")
    if not ready.get("resumed") or not isinstance(found, list) or len(found) != takes:
        raise AssertionError(f"session {session_id} resumed with {ready}")
    return elapsed


def run(url: str, sessions: int, takes: int, resumes: int, token: str | None) -> int:
    """Make the scenes, resume each `resumes` times (all scenes at once); print the report."""
    async def main() -> tuple[float, float, list[float]]:
        started = time.monotonic()
        scenes = await asyncio.gather(*(make_scene(url, takes, token) for _ in range(sessions)))
        made = time.monotonic() - started
        started = time.monotonic()

        async def again_and_again(session_id: str) -> list[float]:
            return [await resume(url, session_id, takes, token) for _ in range(resumes)]

        each = await asyncio.gather(*(again_and_again(s) for s in scenes))
        return made, time.monotonic() - started, [seconds for scene in each for seconds in scene]

    try:
        made, wall, latencies = asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - one line, not a traceback
        print(f"FAILED: {type(error).__name__}: {error}")
        return 1
    print(f"{sessions} scenes of {takes} kept takes made in {made:.1f} s against {url}")
    print(f"{len(latencies)} resumes ({sessions} at once) in {wall:.2f} s: {len(latencies) / wall:.1f} resumes per "
          "second")
    print(f"{'ms':28} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    print(f"{'reconnect and resume':28} {percentiles(latencies)}")
    return 0

"""Early starts (backend/directing/early.py), through a real server: a take of the line as its warm
read it starts before the store has checked it, and is the same take as one started after; a
take the store refuses, or whose prompt changed since the warm, leaves nothing of its early job."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
from live_server import LiveServer, fetch, run, warms_ended

from backend.directing.jobs import SilenceGuard
from backend.directing.loop import EngineLoop
from backend.tools.client import Director, TakeResult

SAMPLING = {"max_new_tokens": 8, "seed": 11}
SCRIPT = [("e1", "The tide is out, early."), ("e2", "Then we walk across, early.")]


async def early_starts(server: LiveServer) -> dict[str, int]:
    metrics = (await fetch(f"{server.http}/metrics")).decode()
    return {result: int(n) for result, n in
            re.findall(r'^retake_take_early_starts_total\{result="(\w+)"\} (\d+)$', metrics, re.M)}


async def scene(server: LiveServer, engine_loop: EngineLoop) -> Director:
    """A session whose script holds SCRIPT, its first line warmed."""
    director = await Director.connect(server.ws)
    await director.open()
    for line_id, text in SCRIPT:
        await director.request({"type": "line.set", "line_id": line_id, "text": text}, "script")
    await warms_ended(engine_loop)
    return director


def test_a_take_of_the_line_as_warmed_starts_early_and_is_the_same_take(make_server: Any,
                                                                        engine_loop: EngineLoop) -> None:
    early = make_server(silence=SilenceGuard(retries=0))
    late = make_server(silence=SilenceGuard(retries=0), early_start=False)

    async def take(server: LiveServer) -> tuple[TakeResult, dict[str, int]]:
        before = await early_starts(server)
        director = await scene(server, engine_loop)
        result = await director.take(*SCRIPT[0], sampling=SAMPLING)
        await director.close()
        after = await early_starts(server)
        return result, {k: after[k] - before.get(k, 0) for k in after}

    (first, counted), (second, _) = run(take(early)), run(take(late))
    assert counted == {"kept": 1, "dropped": 0, "refused": 0, "none": 0}
    assert first.done["finish_reason"] in ("stop", "length") and first.frames
    assert first.frames[0].arrived >= first.queued_at  # its audio only after take.queued
    assert [m["type"] for m in first.messages][:2] == ["take.queued", "take.started"]
    np.testing.assert_array_equal(first.pcm, second.pcm)  # the same seed and prompt: the same take
    assert first.done["timings"]["cached_rows"] == first.done["timings"]["prompt_rows"]  # type: ignore[index]


def test_an_early_start_the_store_refuses_leaves_nothing(make_server: Any, engine_loop: EngineLoop) -> None:
    server = make_server(silence=SilenceGuard(retries=0), limits={"max_takes_per_session": 1})

    async def main() -> tuple[TakeResult, TakeResult, list[Any], dict[str, int]]:
        before = await early_starts(server)
        director = await scene(server, engine_loop)
        first = await director.take("e2", "Not the line as written, so not early.", sampling=SAMPLING)
        # Warmed, so started early, then refused: a long take, which would still run had it leaked.
        refused = await director.start(*SCRIPT[0], sampling={"max_new_tokens": 1000, "seed": 3})
        for _ in range(600):  # the engine lets it go at its next step
            if engine_loop.in_flight == 0 and engine_loop.depth == 0:
                break
            await asyncio.sleep(0.1)
        await director.send({"type": "ping"})
        await director.expect("pong")
        left = list(director.pending)
        await director.close()
        after = await early_starts(server)
        return first, refused, left, {k: after[k] - before.get(k, 0) for k in after}

    first, refused, left, counted = run(main())
    assert counted == {"kept": 0, "dropped": 0, "refused": 1, "none": 1}  # e2 (other words), then e1
    assert first.done["finish_reason"] in ("stop", "length")
    (error,) = refused.of_type("error")
    assert error["code"] == "too_many_takes"
    assert not left, left  # no take.started, no audio, no take.done of the refused take
    assert engine_loop.in_flight == 0 and engine_loop.depth == 0  # (within a minute; it ran for seconds)


def test_an_early_start_whose_prompt_changed_is_dropped(make_server: Any, engine_loop: EngineLoop) -> None:
    """e1 kept warms e2 (hearing it); e1 deleted: e2 now hears nothing, which no warm read. The
    early job on the warm's prompt is dropped and the take runs on the store's."""
    server = make_server(silence=SilenceGuard(retries=0))

    async def main() -> tuple[TakeResult, dict[str, int]]:
        before = await early_starts(server)
        director = await scene(server, engine_loop)
        kept = await director.take(*SCRIPT[0], sampling=SAMPLING)
        await director.request({"type": "take.keep", "take_id": kept.take_id}, "history")
        await warms_ended(engine_loop)
        await director.request({"type": "line.delete", "line_id": "e1"}, "script")
        take = await director.take(*SCRIPT[1], sampling=SAMPLING)
        await director.close()
        after = await early_starts(server)
        return take, {k: after[k] - before.get(k, 0) for k in after}

    take, counted = run(main())
    assert counted == {"kept": 1, "dropped": 1, "refused": 0, "none": 0}  # e1 early; e2 dropped
    assert take.done["finish_reason"] in ("stop", "length")
    assert [m["take_ids"] for m in take.of_type("history")] == [[]]  # the store's prompt: nothing heard
    assert len(take.of_type("take.started")) == 1

"""When the conversation loop ticks (backend/conversation/loop.py `wait_s`, `is_behind`), and the
`unheard` flag a conversation's agent frames carry when silence stood in for its user's audio,
on a real server with the tiny PersonaPlex checkpoint."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from live_server import LiveServer, run
from test_conversation import open_when_free, user_audio

from backend.conversation.loop import TICK_GRACE_S, TICK_S, Conversation, is_behind, wait_s
from backend.transport import unpack_audio_frame

FRAME = np.zeros(1920, np.float32)


@pytest.fixture
def event_loop_object() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def talk(loop: asyncio.AbstractEventLoop, slot: int, arrived: list[float], listening: bool = True,
         waiting_since: float | None = None) -> Conversation:
    """A conversation with a frame queued per arrival time."""
    conversation = Conversation(slot, sink=None, loop=loop, frame_samples=1920, listening=listening)  # type: ignore[arg-type]
    conversation.frames = deque(FRAME for _ in arrived)
    conversation.arrived = deque(arrived)
    conversation.waiting_since = waiting_since if waiting_since is not None else (arrived[0] if arrived else None)
    return conversation


def test_a_tick_runs_when_every_listener_has_a_frame(event_loop_object: asyncio.AbstractEventLoop) -> None:
    now = 100.0
    both = [talk(event_loop_object, 0, [now - 0.01]), talk(event_loop_object, 1, [now])]
    assert wait_s(both, last_tick=now - 0.05, now=now) == 0


def test_a_late_listener_is_waited_for_a_tick_then_fed_silence(event_loop_object: asyncio.AbstractEventLoop) -> None:
    now = 100.0
    early, late = talk(event_loop_object, 0, [now - 0.03]), talk(event_loop_object, 1, [])
    assert wait_s([early, late], last_tick=now - 0.05, now=now) == pytest.approx(TICK_GRACE_S - 0.03)
    assert wait_s([early, late], last_tick=now - 0.05, now=now - 0.03 + TICK_GRACE_S) == 0
    assert wait_s([talk(event_loop_object, 0, []), late], last_tick=now, now=now) is None  # nothing queued: idle


def test_frames_piled_up_a_tick_apart_are_caught_up_at_once(event_loop_object: asyncio.AbstractEventLoop) -> None:
    now = 100.0
    # The loop fell behind a user talking in real time: three frames queued, 80 ms apart, the
    # oldest waiting only since the last tick; the other conversation's next frame is not in yet.
    behind = talk(event_loop_object, 0, [now - 2 * TICK_S, now - TICK_S, now], waiting_since=now - 0.01)
    other = talk(event_loop_object, 1, [])
    assert is_behind([behind, other])
    assert wait_s([behind, other], last_tick=now - 0.01, now=now) == 0


def test_a_burst_sent_at_once_is_paced_by_the_others(event_loop_object: asyncio.AbstractEventLoop) -> None:
    now = 100.0
    burst = talk(event_loop_object, 0, [now - 0.002] * 25, waiting_since=now - 0.01)  # a file sent at once
    other = talk(event_loop_object, 1, [])
    assert not is_behind([burst, other])
    assert wait_s([burst, other], last_tick=now - 0.01, now=now) == pytest.approx(TICK_GRACE_S - 0.01)
    assert not is_behind([talk(event_loop_object, 0, [now - 1.0, now], listening=False)])  # not listening yet


def test_a_listener_that_sends_nothing_hears_ticks_flagged_unheard(talk_server: LiveServer) -> None:
    async def main() -> tuple[list[bool], list[bool], list[bool], list[bool]]:
        first, _ = await open_when_free(talk_server.converse, seed=1)
        assert json.loads(await first.recv()) == {"type": "converse.listening"}
        second, _ = await open_when_free(talk_server.converse, seed=2)
        assert json.loads(await second.recv()) == {"type": "converse.listening"}
        await first.send(user_audio(0.24, seed=3).astype("<i2").tobytes())  # three frames at once
        talking = await frames_until(first, heard=3)
        silent = await frames_next(second, count=3)
        await second.send(user_audio(0.16, seed=4).astype("<i2").tobytes())  # the second's turn: two frames
        answered = await frames_until(second, heard=2)
        quiet = await frames_next(first, count=2)
        await first.close()
        await second.close()
        return talking, silent, answered, quiet

    talking, silent, answered, quiet = run(main())
    # The first listened through the second's system prompt (ticks with nothing of its user's),
    # then its three frames were heard, one a tick.
    assert talking == [True] * (len(talking) - 3) + [False] * 3
    assert silent == [True] * 3  # those three ticks: the second listened and sent nothing
    assert answered == [False] * 2 and quiet == [True] * 2  # and the other way round


async def frames_until(socket: Any, heard: int) -> list[bool]:
    """The `unheard` flags of the agent frames this socket receives, until `heard` of them heard a frame."""
    flags: list[bool] = []
    while flags.count(False) < heard:
        message = await socket.recv()
        if isinstance(message, bytes):
            flags.append(unpack_audio_frame(message)[0].unheard)
    return flags


async def frames_next(socket: Any, count: int) -> list[bool]:
    """The `unheard` flags of the next `count` agent frames."""
    flags: list[bool] = []
    while len(flags) < count:
        message = await socket.recv()
        if isinstance(message, bytes):
            flags.append(unpack_audio_frame(message)[0].unheard)
    return flags

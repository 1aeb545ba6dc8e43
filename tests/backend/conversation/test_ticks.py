"""Ticks as frames arrive (backend/conversation/loop.py): a tick hears the conversations that have a
frame of their user's and moves on those only, so nobody waits for anyone else's audio; on a
real server with the tiny PersonaPlex checkpoint."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import numpy as np
from live_server import LiveServer, run
from test_conversation import open_when_free, user_audio, wait_until_idle

from backend.conversation.loop import Conversation, tick_due
from backend.transport import unpack_audio_frame


def test_a_tick_is_due_for_any_frame_or_system_prompt() -> None:
    loop = asyncio.new_event_loop()
    try:
        def talk(listening: bool, frames: int) -> Conversation:
            conversation = Conversation(0, sink=None, loop=loop, frame_samples=1920,  # type: ignore[arg-type]
                                        listening=listening)
            conversation.frames = deque(np.zeros(1920, np.float32) for _ in range(frames))
            return conversation

        assert not tick_due([])
        assert not tick_due([talk(True, 0), talk(True, 0)])  # everyone listening, nobody has spoken: wait
        assert tick_due([talk(True, 0), talk(True, 1)])  # one frame is enough: nobody waits for the other
        assert tick_due([talk(True, 0), talk(False, 0)])  # a system prompt to read
    finally:
        loop.close()


async def agent_frames(socket: Any, count: int, then_none: bool = False) -> list[int]:
    """The seq numbers of the next `count` agent frames; `then_none`: and -1 for each one more that
    came before the server's answer to a ping."""
    seqs: list[int] = []
    while len(seqs) < count:
        message = await socket.recv()
        if isinstance(message, bytes):
            seqs.append(unpack_audio_frame(message)[0].seq)
    if then_none:
        await socket.send(json.dumps({"type": "ping"}))  # the server answers in order: frames before the pong
        while (message := await socket.recv()) and isinstance(message, bytes):
            seqs.append(-1)  # an agent frame nobody asked for
    return seqs


def test_a_conversation_is_answered_without_waiting_for_the_others(talk_server: LiveServer) -> None:
    async def main() -> tuple[list[int], list[int], list[int], list[int]]:
        first, _ = await open_when_free(talk_server.converse, seed=1)
        assert json.loads(await first.recv()) == {"type": "converse.listening"}
        second, _ = await open_when_free(talk_server.converse, seed=2)
        assert json.loads(await second.recv()) == {"type": "converse.listening"}
        await first.send(user_audio(0.24, seed=3).astype("<i2").tobytes())  # three frames; the second says nothing
        talking = await agent_frames(first, 3)
        silent = await agent_frames(second, 0, then_none=True)  # ticks ran for the first only
        await second.send(user_audio(0.16, seed=4).astype("<i2").tobytes())  # now the second: two frames
        answered = await agent_frames(second, 2)
        waited = await agent_frames(first, 0, then_none=True)
        await first.close()
        await second.close()
        return talking, silent, answered, waited

    talking, silent, answered, waited = run(main())
    assert talking == [0, 1, 2] and answered == [0, 1]  # an agent frame for each frame heard, in order
    assert silent == [] and waited == []  # and none for a conversation whose user sent nothing


def test_two_conversations_heard_apart_answer_as_each_alone(talk_server: LiveServer) -> None:
    """A conversation's answers do not depend on when the others' frames came: heard in turns or
    together, each gets the frames it gets when the other talks at the same time."""
    user = [user_audio(0.4, seed=5), user_audio(0.4, seed=6)]  # five frames each

    async def conversation_pair(interleaved: bool) -> list[list[bytes]]:
        sockets = []
        for seed in (11, 12):
            socket, _ = await open_when_free(talk_server.converse, seed=seed)
            assert json.loads(await socket.recv()) == {"type": "converse.listening"}
            sockets.append(socket)
        frames: list[list[bytes]] = [[], []]

        async def collect(index: int, count: int) -> None:
            while len(frames[index]) < count:
                message = await sockets[index].recv()
                if isinstance(message, bytes):
                    frames[index].append(unpack_audio_frame(message)[1])

        if interleaved:  # one frame each in turns, each answered before the other speaks
            for k in range(5):
                for index in (0, 1):
                    await sockets[index].send(user[index][1920 * k:1920 * (k + 1)].astype("<i2").tobytes())
                    await collect(index, k + 1)
        else:  # all at once, both
            for index in (0, 1):
                await sockets[index].send(user[index].astype("<i2").tobytes())
            await asyncio.gather(collect(0, 5), collect(1, 5))
        for socket in sockets:
            await socket.close()
        return frames

    wait_until_idle(talk_server)  # both slots free: each pair takes slots 0 and 1, in order (the same rows)
    apart = run(conversation_pair(True))
    wait_until_idle(talk_server)
    together = run(conversation_pair(False))
    for index in (0, 1):
        np.testing.assert_allclose(np.frombuffer(b"".join(apart[index]), "<i2").astype(np.int32),
                                   np.frombuffer(b"".join(together[index]), "<i2").astype(np.int32), atol=1)


"""The conversation loop gives each conversation its own slot, also when one joins while the engine
thread is still starting another (the tiny PersonaPlex engine, paused inside its `start`), and
starts a named voice by its name, so the engine plans a persona and voice once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
from live_server import run

from backend.conversation.loop import ConversationLoop, NoFreeSlot
from engine.personaplex.engine import PersonaPlex


class Sink:
    def listening(self) -> None:
        pass

    def frame(self, tick: int, pcm: np.ndarray, text: str | None) -> None:
        pass

    def failed(self, message: str) -> None:
        pass


def test_a_join_while_another_is_starting_gets_another_slot(personaplex_checkpoint: Path) -> None:
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=2)
    starting, go_on = threading.Event(), threading.Event()
    start = engine.start

    def paused_start(*args: Any, **kwargs: Any) -> None:
        starting.set()  # the engine thread took the first join and is starting its slot
        assert go_on.wait(60)
        start(*args, **kwargs)

    engine.start = paused_start  # type: ignore[method-assign]
    conversations = ConversationLoop(lambda: engine)
    conversations.start()

    async def main() -> tuple[int, int, str, list[str | None]]:
        first = asyncio.create_task(conversations.join(None, None, 1, Sink()))
        assert await asyncio.to_thread(starting.wait, 60)
        second = asyncio.create_task(conversations.join(None, None, 2, Sink()))
        await asyncio.sleep(0)  # the second join has picked its slot
        try:
            await conversations.join(None, None, 3, Sink())
            refused = ""
        except NoFreeSlot as error:
            refused = str(error)
        go_on.set()
        talks = await asyncio.gather(first, second)
        for talk in talks:
            conversations.leave(talk)
        return talks[0].slot, talks[1].slot, refused, [talk.voice for talk in talks]

    try:
        one, two, refused, voices = run(main())
    finally:
        go_on.set()
        conversations.stop()
    assert {one, two} == {0, 1}
    assert refused == "all 2 conversation slots are in use; try again later"
    # Both with the default persona and voice: one plan (engine/personaplex/plans.py), the second taken from it.
    assert voices == ["NATF2", "NATF2"] and (engine.plans.misses, engine.plans.hits) == (1, 1)

"""The conversation loop's pace line (backend/conversation/pace.py): what it counts, and that a
real conversation on the tiny PersonaPlex engine fills it, tick by tick."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
from live_server import run

from backend.conversation.loop import ConversationLoop
from backend.conversation.pace import TickPace
from engine.personaplex.engine import PersonaPlex

LINE = re.compile(r"converse pace: [\d.]+ s: (\d+) ticks \(step p50 ([\d.]+) ms, p95 ([\d.]+) ms; waiting between "
                  r"ticks p50 ([\d.]+) ms, p95 ([\d.]+) ms\), ([\d.]+) conversations heard and ([\d.]+) reading "
                  r"their system prompt a tick, (\d+) frames heard"
                  r"(?:; (\d+) ticks also read a system prompt chunk \(step p50 ([\d.]+) ms, max ([\d.]+) ms\))?"
                  r"(?:; (\d+) conversations started between ticks \(a batch p50 ([\d.]+) ms, max ([\d.]+) ms\))?"
                  r"(?:; frames queued behind a tick p95 (\d+), max (\d+))?")


def test_the_line_counts_the_ticks_since_the_last_report() -> None:
    pace = TickPace()
    assert pace.report() is None  # no tick: no line
    pace.tick(0.070, 0.010, heard=2, prompting=1)
    pace.tick(0.090, 0.002, heard=4, prompting=1, chunk=True)
    found = LINE.fullmatch(pace.report() or "")
    assert found is not None
    assert found.groups()[:1] == ("2",) and float(found[2]) in (70.0, 90.0) and float(found[3]) == 90.0
    assert (float(found[6]), float(found[7]), int(found[8])) == (3.0, 1.0, 6)
    assert (int(found[9]), float(found[10]), float(found[11])) == (1, 90.0, 90.0)  # the tick that read a chunk
    assert found[12] is None and found[15] is None  # nobody started, no frame left queued: no such parts
    assert pace.report() is None  # reset
    pace.started(8, 0.004)
    pace.tick(0.050, 0.001, heard=1, prompting=0, backlog=3)
    pace.started(2, 0.002)
    pace.tick(0.050, 0.001, heard=1, prompting=0)
    found = LINE.fullmatch(pace.report() or "")
    assert found is not None and found[9] is None  # no chunk read: no chunk part
    assert (int(found[12]), float(found[14])) == (10, 4.0)  # ten started, the longer batch 4 ms
    assert (int(found[15]), int(found[16])) == (3, 3)  # a tick left 3 frames queued behind it


class Sink:
    def __init__(self, frames: int) -> None:
        self.heard = asyncio.Event()
        self.done = asyncio.Event()
        self.frames, self.wanted = 0, frames

    def listening(self) -> None:
        self.heard.set()

    def frame(self, tick: int, pcm: np.ndarray, text: str | None) -> None:
        self.frames += 1
        if self.frames >= self.wanted:
            self.done.set()

    def failed(self, message: str) -> None:
        raise AssertionError(message)


def test_a_conversation_fills_the_pace_line(personaplex_checkpoint: Path) -> None:
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=1)
    conversations = ConversationLoop(lambda: engine)
    conversations.start()

    async def main() -> None:
        sink = Sink(frames=3)
        talk = await conversations.join(None, None, 1, sink)
        await asyncio.wait_for(sink.heard.wait(), 120)  # its system prompt read, tick after tick
        conversations.feed(talk, bytes(2 * 3 * conversations.frame_samples))  # three frames of silence
        await asyncio.wait_for(sink.done.wait(), 120)
        conversations.leave(talk)

    try:
        run(main())
    finally:
        conversations.stop()  # the engine thread is done: its pace is read from here alone
    found = LINE.fullmatch(conversations.pace.report() or "")
    assert found is not None
    ticks, heard, prompting, frames = int(found[1]), float(found[6]), float(found[7]), int(found[8])
    assert ticks >= 4 and frames == 3  # the system prompt's ticks, then a tick for each of the three frames
    assert 0 < heard < 1 and 0 < prompting < 1  # one conversation: reading its prompt, then listening
    assert float(found[2]) > 0
    assert int(found[9]) >= 1  # the ticks that read its system prompt
    assert int(found[12]) == 1  # the join, started between ticks

"""Takes of several sessions decoding together (the engine's slots) on a real server, and the
engine loop's admission order (earliest deadline first) on the real engine."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from live_server import LiveServer, run

from backend.directing.jobs import Progress, TakeJob, TakeOutcome
from backend.directing.loop import EngineLoop
from backend.tools.client import AudioFrame, Director, TakeResult
from engine import AudioWindow, Done, Drama3Engine, Prompt, Sampling

LINE = {"sampling": {"max_new_tokens": 30, "seed": 21}}
OTHER = {"sampling": {"max_new_tokens": 30, "seed": 22}}


async def follow(director: Director, take: TakeResult) -> dict[str, float]:
    """Collect a take to its take.done, noting when its started, first audio and done arrived."""
    seen: dict[str, float] = {}
    while "take.done" not in seen:
        item = await director.receive()
        if isinstance(item, AudioFrame):
            assert item.header.take_id == take.take_id
            take.frames.append(item)
            seen.setdefault("audio", item.arrived)
        elif item.get("take_id") == take.take_id:
            take.messages.append(item)
            seen.setdefault(str(item["type"]), time.monotonic())
    return seen


def test_two_sessions_takes_stream_concurrently(server: LiveServer, engine_loop: EngineLoop) -> None:
    assert engine_loop.slots >= 2

    async def main() -> None:
        one, two = await Director.connect(server.ws), await Director.connect(server.ws)
        await one.open()
        await two.open()
        takes = [await one.start("a", "From the first session.", **LINE),
                 await two.start("b", "And from the second.", **OTHER)]
        first, second = await asyncio.gather(follow(one, takes[0]), follow(two, takes[1]))
        # Both decode at once: each started, and streamed audio, before either ended.
        assert max(first["take.started"], second["take.started"]) < min(first["take.done"], second["take.done"])
        assert max(first["audio"], second["audio"]) < min(first["take.done"], second["take.done"])
        for take in takes:
            assert take.done["finish_reason"] == "length" and take.done["frames"] == 30
        # The same seeded take alone gives the same audio.
        alone = await one.take("a2", "From the first session.", history=[], **LINE)
        np.testing.assert_array_equal(alone.pcm, takes[0].pcm)
        await one.close()
        await two.close()

    run(main())


def test_cancelling_one_take_leaves_the_other_intact(server: LiveServer) -> None:
    async def main() -> None:
        one, two = await Director.connect(server.ws), await Director.connect(server.ws)
        await one.open()
        await two.open()
        kept = await one.start("a", "I go on.", **LINE)
        cut = await two.start("b", "I am cut.", sampling={"max_new_tokens": 200, "seed": 5})

        async def cancel_after_first_audio() -> dict[str, float]:
            item = await two.receive()
            while not isinstance(item, AudioFrame):
                cut.messages.append(item)  # type: ignore[arg-type]
                item = await two.receive()
            cut.frames.append(item)
            await two.send({"type": "take.cancel", "take_id": cut.take_id})
            return await follow(two, cut)

        await asyncio.gather(follow(one, kept), cancel_after_first_audio())
        assert cut.done["finish_reason"] == "cancelled" and int(cut.done["frames"]) < 200  # type: ignore[arg-type]
        assert kept.done["finish_reason"] == "length"
        alone = await one.take("a2", "I go on.", history=[], **LINE)
        np.testing.assert_array_equal(alone.pcm, kept.pcm)
        await one.close()
        await two.close()

    run(main())


class Recorder:
    """A TakeSink that notes the order takes start in, and their outcomes."""

    def __init__(self, name: str, started: list[str]) -> None:
        self.name, self.starts = name, started
        self.outcome: asyncio.Future[TakeOutcome] = asyncio.get_running_loop().create_future()
        self.audio = asyncio.Event()

    def started(self, attempt: int, sampling: Sampling) -> None:
        self.starts.append(self.name)

    def history(self, used: int) -> None:
        pass

    def window(self, attempt: int, window: AudioWindow) -> None:
        self.audio.set()

    def retry(self, attempt: int, message: str) -> None:
        pass

    def done(self, outcome: TakeOutcome) -> None:
        self.outcome.set_result(outcome)


def line(text: str):
    def build(engine: Drama3Engine, sampling: Sampling) -> Prompt:
        return engine.prompt(text, None, [], sampling)

    return build


def test_waiting_takes_start_earliest_deadline_first(engine_loop: EngineLoop) -> None:
    async def main() -> None:
        loop, started = asyncio.get_running_loop(), []
        now = time.monotonic()

        def job(name: str, deadline: float | None, frames: int) -> tuple[TakeJob, Recorder]:
            sink = Recorder(name, started)
            return TakeJob(line(f"Take {name}."), Sampling(max_new_tokens=frames, seed=1), sink, loop, deadline,
                           None), sink

        busy = [job(f"busy{i}", None, 1200) for i in range(engine_loop.slots)]  # every slot decodes
        for busy_job, _ in busy:
            engine_loop.submit(busy_job)
        for _, sink in busy:
            await asyncio.wait_for(sink.audio.wait(), 60)
        # Submitted in this order while no slot is free: none of them starts yet.
        waiting = [job("none", None, 2), job("late", now + 300, 2), job("soon", now + 100, 2),
                   job("middle", now + 200, 2)]
        for waiting_job, _ in waiting:
            engine_loop.submit(waiting_job)
        assert engine_loop.depth == 4
        for busy_job, _ in busy:
            busy_job.cancel()
        outcomes = await asyncio.wait_for(asyncio.gather(*(sink.outcome for _, sink in busy + waiting)), 120)
        assert started == [f"busy{i}" for i in range(engine_loop.slots)] + ["soon", "middle", "late", "none"]
        assert [o.finish_reason for o in outcomes] == ["cancelled"] * len(busy) + ["length"] * 4

    run(main())


def test_a_job_failing_on_its_window_ends_alone_wherever_the_window_was_handed(engine_loop: EngineLoop) -> None:
    """A job whose window cannot be handled (mid-step, loop.py `_hand_early`, or after the step)
    ends with that error after the step; the take beside it streams to its end."""

    class Failing(TakeJob):
        def handle(self, engine: Drama3Engine, events: list[AudioWindow | Done]) -> Progress:
            if any(isinstance(event, AudioWindow) for event in events):
                raise RuntimeError("the sink broke")
            return super().handle(engine, events)

    async def main() -> None:
        loop, started = asyncio.get_running_loop(), []
        failing, kept = Recorder("failing", started), Recorder("kept", started)
        engine_loop.submit(Failing(line("I break."), Sampling(max_new_tokens=40, seed=1), failing, loop, None, None))
        engine_loop.submit(TakeJob(line("I go on."), Sampling(max_new_tokens=40, seed=2), kept, loop, None, None))
        broke, went_on = await asyncio.wait_for(asyncio.gather(failing.outcome, kept.outcome), 120)
        assert (broke.finish_reason, broke.error) == ("error", "RuntimeError: the sink broke")
        assert went_on.codes is not None and went_on.codes.shape[1] == 40
        assert went_on.finish_reason == "length" and went_on.samples == 40 * engine_loop.frame_samples

    run(main())

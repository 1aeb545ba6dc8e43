"""A server killed mid-take (SIGKILL, no shutdown) keeps the audio the director heard: the take
comes back after a restart as an error with every window that was sent, its export starts
with exactly the samples that arrived, and it can be kept (it has audio) and heard by the
next take."""

from __future__ import annotations

import io
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from live_server import run, serve
from test_commands import free_port

from backend.store import STOPPED_DURING_TAKE
from backend.tools.client import AudioFrame, Director


@pytest.mark.slow
def test_a_killed_server_keeps_the_audio_that_was_heard(tiny_checkpoint: Path, tmp_path: Path) -> None:
    port = free_port()
    server = serve(tiny_checkpoint, tmp_path, port)
    try:
        async def until_killed() -> tuple[str, int, np.ndarray]:
            director = await Director.connect(f"ws://127.0.0.1:{port}/ws")
            ready = await director.open()
            take = await director.start("l1", "A long speech that goes on.",
                                        sampling={"seed": 11, "max_new_tokens": 1000})
            assert take.take_id, take.messages
            heard: list[np.ndarray] = []
            while sum(len(pcm) for pcm in heard) < 3 * 10 * 2048:  # three windows
                message = await director.receive()
                if isinstance(message, AudioFrame):
                    heard.append(message.pcm)
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
            return str(ready["session_id"]), take.take_id, np.concatenate(heard)

        session_id, take_id, heard = run(until_killed())
    finally:
        server.kill()
        server.wait(timeout=30)

    server = serve(tiny_checkpoint, tmp_path, port)
    try:
        async def resumed() -> dict:
            director = await Director.connect(f"ws://127.0.0.1:{port}/ws")
            ready = await director.open(session_id)
            interrupted = ready["takes"][0]  # type: ignore[index]
            await director.send({"type": "take.keep", "take_id": take_id})
            kept = await director.receive()  # the history, not take_not_usable
            assert isinstance(kept, dict) and (kept["type"], kept.get("take_ids")) == ("history", [take_id]), kept
            after = await director.take("l2", "And then.", sampling={"seed": 1, "max_new_tokens": 4})
            assert after.done["finish_reason"] in ("stop", "length"), after.done
            (history,) = after.of_type("history")
            assert (history["take_ids"], history["dropped"]) == ([take_id], [])
            await director.close()
            return interrupted  # type: ignore[no-any-return]

        take = run(resumed())
        assert (take["take_id"], take["state"], take["finish_reason"], take["error"]) == (
            take_id, "done", "error", STOPPED_DURING_TAKE)
        assert take["frames"] * 2048 == take["samples"] >= len(heard)  # what was written before it was sent
        url = f"http://127.0.0.1:{port}/sessions/{session_id}/takes/{take_id}.wav"
        with urllib.request.urlopen(urllib.request.Request(url, headers=Director.export_headers(session_id))) as reply:
            exported, _ = sf.read(io.BytesIO(reply.read()), dtype="int16")
        assert len(exported) == take["samples"]
        np.testing.assert_array_equal(exported[:len(heard)], heard)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)

"""Sessions on a real server: voices, isolation between sessions, resume after a reconnect and a restart."""

from __future__ import annotations

import asyncio
import base64
import io
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from live_server import LiveServer, fetch, run

from backend.tools.client import Director

LINE = {"sampling": {"max_new_tokens": 12, "seed": 4}}


def clip(seconds: float = 0.5, hz: float = 220.0) -> str:
    t = np.arange(int(44100 * seconds)) / 44100
    buffer = io.BytesIO()
    sf.write(buffer, (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 44100, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_two_sessions_never_see_each_others_voice_takes_or_audio(server: LiveServer) -> None:
    async def main() -> None:
        one, two = await Director.connect(server.ws), await Director.connect(server.ws)
        ready_one, ready_two = await one.open(), await two.open()
        assert ready_one["session_id"] != ready_two["session_id"]
        voice = await one.request({"type": "voice.set", "references": [{"audio": clip(), "text": "A low hum."}],
                                   "ref": "v"}, "voice.ready")
        assert voice["ref"] == "v"
        [reference] = voice["voice"]["references"]  # type: ignore[index]
        assert reference["text"] == "A low hum." and reference["frames"] >= 10  # 0.5 s at ~21.5 frames/s
        # Both sessions take at once: each gets only its own messages and audio.
        takes = await asyncio.gather(one.take("a", "From the first.", **LINE),
                                     two.take("b", "From the second.", **LINE))
        for take in takes:
            assert take.done["finish_reason"] in ("stop", "length")
            assert {frame.header.take_id for frame in take.all_frames} == {take.take_id}
        assert takes[0].take_id != takes[1].take_id
        for director in (one, two):
            assert director.pending == []
        # The second session cannot name the first one's take, nor export it through its own id.
        error = await two.request({"type": "take.keep", "take_id": takes[0].take_id}, "error")
        assert (error["code"], error["take_id"]) == ("unknown_take", takes[0].take_id)
        sid_one, sid_two = ready_one["session_id"], ready_two["session_id"]
        own, other = Director.export_headers(str(sid_one)), Director.export_headers(str(sid_two))
        assert status_of(f"{server.http}/sessions/{sid_two}/takes/{takes[0].take_id}.wav", other) == 404
        assert status_of(f"{server.http}/sessions/{sid_one}/takes/{takes[0].take_id}.wav", other) == 404
        assert status_of(f"{server.http}/sessions/{sid_one}/takes/{takes[0].take_id}.wav", own) == 200
        await one.close()
        await two.close()
        # What each session stored is its own.
        for session_id, take, voiced in ((sid_one, takes[0], True), (sid_two, takes[1], False)):
            director = await Director.connect(server.ws)
            ready = await director.open(str(session_id))
            assert [t["take_id"] for t in ready["takes"]] == [take.take_id]  # type: ignore[index, union-attr]
            assert (ready["voice"] is not None) == voiced
            assert ready["takes"][0]["voice_id"] == (ready["voice"]["voice_id"] if voiced else None)  # type: ignore
            await director.close()

    run(main())


async def build_scene(server: LiveServer) -> tuple[str, dict[str, Any]]:
    """A session with a character voice, two lines, a kept take and a dropped one."""
    director = await Director.connect(server.ws)
    ready = await director.open()
    await director.request({"type": "voice.set", "character": {"name": "Mara", "description": "a tired keeper"}},
                           "voice.ready")
    first = await director.take("l1", "The lamp is out.", **LINE)
    await director.request({"type": "take.keep", "take_id": first.take_id}, "history")
    second = await director.take("l2", "Then light it.", **LINE)
    await director.request({"type": "take.keep", "take_id": second.take_id}, "history")
    await director.request({"type": "take.drop", "take_id": second.take_id}, "history")
    await director.close()
    return str(ready["session_id"]), {"takes": [first, second]}


def check_resumed(ready: dict[str, Any], session_id: str, scene: dict[str, Any]) -> None:
    first, second = scene["takes"]
    assert ready["session_id"] == session_id and ready["resumed"] is True
    assert ready["voice"]["character"] == {"name": "Mara", "description": "a tired keeper", "scene": None}
    assert ready["lines"] == [{"line_id": "l1", "text": "The lamp is out.", "position": 0, "character_id": None},
                              {"line_id": "l2", "text": "Then light it.", "position": 1, "character_id": None}]
    takes = ready["takes"]
    assert [t["take_id"] for t in takes] == [first.take_id, second.take_id]
    assert [t["kept"] for t in takes] == [True, False]
    assert ready["history"] == [first.take_id]
    for stored, take in zip(takes, (first, second)):
        done = take.done
        assert stored["state"] == "done"
        # The stored timings are the message's, less its live-only `first_audio_sent_ms` (docs/protocol.md).
        live = {key: value for key, value in done["timings"].items() if key != "first_audio_sent_ms"}
        assert "first_audio_sent_ms" in done["timings"] and "first_audio_sent_ms" not in stored["timings"]
        assert (stored["finish_reason"], stored["frames"], stored["samples"], stored["timings"]) == (
            done["finish_reason"], done["frames"], done["samples"], live)
        assert stored["history"] == take.of_type("history")[0]["take_ids"]
        assert stored["audio_url"] == f"/sessions/{session_id}/takes/{take.take_id}.wav"


def test_resume_after_reconnect_loses_nothing(server: LiveServer) -> None:
    async def main() -> None:
        session_id, scene = await build_scene(server)
        director = await Director.connect(server.ws)
        check_resumed(await director.open(session_id), session_id, scene)
        # The resumed session goes on: its kept take conditions the next take.
        take = await director.take("l3", "Go on.", **LINE)
        assert take.of_type("history")[0]["take_ids"] == [scene["takes"][0].take_id]
        await director.close()

    run(main())


def test_resume_after_a_server_restart_loses_nothing(make_server: Any, tmp_path: Any) -> None:
    first_server = make_server(data_dir=tmp_path)
    session_id, scene = run(build_scene(first_server))
    first_server.stop()
    second_server = make_server(data_dir=tmp_path)

    async def main() -> None:
        director = await Director.connect(second_server.ws)
        check_resumed(await director.open(session_id), session_id, scene)
        await director.close()
        take = scene["takes"][0]
        wav = await fetch(f"{second_server.http}/sessions/{session_id}/takes/{take.take_id}.wav",
                          Director.export_headers(session_id))
        samples, _ = sf.read(io.BytesIO(wav), dtype="int16")
        np.testing.assert_array_equal(samples, take.pcm)

    run(main())


def test_a_disconnect_cancels_the_take_and_keeps_what_was_made(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        take = await director.start("l1", "A long speech that goes on.", sampling={"seed": 11})
        await director.expect("take.started")
        await director.close()
        for _ in range(200):  # the engine stops the take at its next step
            again = await Director.connect(server.ws)
            resumed = await again.open(str(ready["session_id"]))
            await again.close()
            stored = resumed["takes"][0]  # type: ignore[index]
            if stored["state"] == "done":  # type: ignore[index]
                break
            await asyncio.sleep(0.05)
        assert stored["take_id"] == take.take_id  # type: ignore[index]
        assert stored["finish_reason"] == "cancelled"  # type: ignore[index]

    run(main())


def test_resuming_elsewhere_takes_the_session_over(server: LiveServer) -> None:
    async def main() -> None:
        old = await Director.connect(server.ws)
        ready = await old.open()
        new = await Director.connect(server.ws)
        await new.open(str(ready["session_id"]))
        error = await old.expect("error")
        assert error["code"] == "session_taken_over"
        await old.socket.wait_closed()
        assert old.socket.close_code == 1000
        assert (await new.request({"type": "ping", "t": 1}, "pong"))["t"] == 1
        await new.close()

    run(main())


def long_clip(seconds: float) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(int(8000 * seconds), np.int16), 8000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("voice", [
    {"references": [{"audio": base64.b64encode(b"RIFF not really a wav").decode(), "text": "Hi."}]},
    {"references": [{"audio": long_clip(61), "text": "Too long."}]},  # past limits.max_reference_seconds
    {"character": {"name": "Ma:ra", "description": "a keeper"}},
])
def test_a_bad_voice_is_refused_and_the_old_one_stays(server: LiveServer, voice: dict[str, Any]) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        session_id = str((await director.open())["session_id"])
        kept = await director.request({"type": "voice.set", "character": {"name": "Ann", "description": "calm"}},
                                      "voice.ready")
        error = await director.request({"type": "voice.set", **voice, "ref": "bad"}, "error")
        assert error["code"] in ("bad_reference", "bad_field") and error["ref"] == "bad"
        take = await director.take("l1", "Still me.", **LINE)
        assert take.done["finish_reason"] in ("stop", "length")
        await director.close()
        again = await Director.connect(server.ws)
        resumed = await again.open(session_id)
        assert resumed["voice"] == kept["voice"]
        assert resumed["takes"][0]["voice_id"] == kept["voice"]["voice_id"]  # type: ignore[index]
        await again.close()

    run(main())

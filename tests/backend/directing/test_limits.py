"""Limits on a real server: sessions, queue, takes, the silence guard (host, origin, token: test_admission.py)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import sqlite3
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from live_server import LiveServer, fetch, run
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from backend.directing.jobs import SilenceGuard
from backend.directing.loop import EngineLoop
from backend.tools.client import Director

LONG = {"sampling": {"seed": 11}, "length_guard": False}  # runs to max_new_tokens (the demo weights never stop)


def http_status(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {}), timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as error:
        return error.code


def refused(url: str, **options: Any) -> int:
    async def main() -> int:
        with pytest.raises(InvalidStatus) as caught:
            await Director.connect(url, **options)
        return int(caught.value.response.status_code)

    return run(main())


def test_too_many_sessions(make_server: Any) -> None:
    server = make_server(limits={"max_sessions": 1})

    async def main() -> None:
        first = await Director.connect(server.ws)
        await first.open()
        second = await Director.connect(server.ws)
        error = await second.expect("error")
        assert error["code"] == "too_many_sessions"
        await second.socket.wait_closed()
        assert second.socket.close_code == 1013
        await first.close()
        third = await Director.connect(server.ws)  # a slot is free again
        await third.open()
        await third.close()

    run(main())


def test_a_full_queue_answers_busy(make_server: Any, engine_loop: EngineLoop) -> None:
    server = make_server(limits={"max_queue": 1})
    slots = engine_loop.slots

    async def main() -> None:
        directors = [await Director.connect(server.ws) for _ in range(slots + 2)]
        for director in directors:
            await director.open()
        running = []
        for director in directors[:slots]:  # every slot decodes a long take
            running.append(await director.start("a", "A long speech that goes on.", **LONG))
            await director.expect("take.started")
        waiting = await directors[slots].start("a", "Waiting.", sampling={"max_new_tokens": 2})
        assert waiting.messages[0]["position"] == 1
        turned_away = await directors[slots + 1].start("a", "No room.", sampling={"max_new_tokens": 2}, ref="r")
        error = turned_away.messages[0]
        assert (error["type"], error["code"], error["ref"]) == ("error", "busy", "r")
        # The hint comes from the queue: the takes ahead at the measured frame rate, said in the message too.
        match = re.fullmatch(r"the engine queue is full \(1 waiting, about ([\d.]+) s of takes ahead\); "
                             r"retry in ([\d.]+) s", str(error["message"]))
        assert match is not None, error["message"]
        assert float(match[1]) > 0 and int(error["retry_after_ms"]) == round(float(match[2]) * 1000) > 0  # type: ignore[call-overload]
        for director, take in zip(directors, running):
            await director.send({"type": "take.cancel", "take_id": take.take_id})
            await director.finish(take)
        await directors[slots].finish(waiting)
        assert waiting.done["finish_reason"] in ("stop", "length")
        for director in directors:
            await director.close()

    run(main())


def test_takes_per_session(make_server: Any) -> None:
    server = make_server(limits={"max_takes_per_session": 2})

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        for _ in range(2):
            await director.take("a", "Again.", sampling={"max_new_tokens": 2})
        error = await director.request({"type": "take.start", "line_id": "a", "text": "Again."}, "error")
        assert error["code"] == "too_many_takes"
        await director.close()

    run(main())


def test_silence_guard_retries_and_tells_the_client(make_server: Any) -> None:
    # Every sample counts as silent (level 32767): the first attempt is stopped after 0.3 s of
    # audio and retried once with seed + 1; the retry runs to its end.
    server = make_server(silence=SilenceGuard(seconds=0.3, level=32767, retries=1))

    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        take = await director.take("a", "Hello?", sampling={"max_new_tokens": 40, "seed": 100})
        kinds = [m["type"] for m in take.messages]
        assert kinds == ["take.queued", "take.started", "history", "take.retry", "take.started", "take.done"]
        retry = take.of_type("take.retry")[0]
        assert (retry["attempt"], retry["reason"]) == (2, "silence") and "seed 101" in str(retry["message"])
        assert [m["attempt"] for m in take.of_type("take.started")] == [1, 2]
        done = take.done
        assert done["attempts"] == 2
        # Audio restarted at seq 0, sample 0; what was kept is the second attempt, and it is what exports.
        assert take.frames[0].header.seq == 0 and take.frames[0].header.start_sample == 0
        assert len(take.all_frames) > len(take.frames)
        assert sum(len(f.pcm) for f in take.frames) == done["samples"]
        url = f"{server.http}/sessions/{ready['session_id']}/takes/{take.take_id}.wav"
        exported, _ = sf.read(io.BytesIO(await fetch(url, Director.export_headers(str(ready["session_id"])))),
                              dtype="int16")
        np.testing.assert_array_equal(exported, take.pcm)
        resumed = await Director.connect(server.ws)
        stored = (await resumed.open(str(ready["session_id"])))["takes"][0]  # type: ignore[index]
        assert stored["sampling"]["seed"] == 101 and stored["attempts"] == 2  # type: ignore[index]
        await resumed.close()
        await director.close()

    run(main())


def test_metrics_and_health(server: LiveServer) -> None:
    with urllib.request.urlopen(f"{server.http}/health", timeout=30) as response:
        health = json.loads(response.read())
    assert health["status"] == "ok" and health["engine"] == "drama3" and health["demo_weights"] is True

    async def one_take() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await director.take("a", "Count me.", sampling={"max_new_tokens": 4})
        await director.close()

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as response:
            text = response.read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    before = scrape()
    run(one_take())
    after = scrape()
    counter = 'retake_takes_total{{finish_reason="{}"}}'
    finished = sum(after[counter.format(r)] - before[counter.format(r)] for r in ("stop", "length"))
    assert finished == 1
    assert after["retake_first_audio_seconds_count"] == before["retake_first_audio_seconds_count"] + 1
    assert after["retake_decode_frames_per_second_count"] == before["retake_decode_frames_per_second_count"] + 1
    assert "retake_queue_depth" in after and "retake_sessions" in after


def test_the_studio_page(make_server: Any, tmp_path: Any) -> None:
    built = tmp_path / "dist"
    built.mkdir()
    (built / "index.html").write_text("<!doctype html><title>studio marker</title>")
    with urllib.request.urlopen(f"{make_server(static_dir=built).http}/", timeout=30) as response:
        assert "studio marker" in response.read().decode()
    with urllib.request.urlopen(f"{make_server(static_dir=tmp_path / 'missing').http}/", timeout=30) as response:
        page = response.read().decode()
    assert response.status == 200 and "npm run build" in page


def test_no_per_message_compression(server: LiveServer) -> None:
    async def main() -> None:
        socket = await connect(server.ws, compression="deflate")  # the client offers it
        assert socket.protocol.extensions == []  # the server declines: audio does not compress
        await socket.close()

    run(main())


@pytest.mark.slow
def test_a_client_that_does_not_read_gets_its_take_stopped(make_server: Any, tmp_path: Any) -> None:
    server = make_server(data_dir=tmp_path, send_queue_frames=1, send_buffer=16384)

    async def main() -> None:
        # Small socket buffers on both ends and max_queue=1: the client stops taking audio after a
        # few windows, the server's socket stops draining, and its send queue of one frame fills.
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", int(server.http.rsplit(":", 1)[1])))
        client = await connect(server.ws, sock=raw, compression=None, max_queue=1, max_size=None)
        await client.send(json.dumps({"type": "session.open"}))
        await client.recv()
        await client.send(json.dumps({"type": "take.start", "line_id": "a", "text": "A long speech that goes on.",
                                      "sampling": {"seed": 11}, "length_guard": False}))
        # Without reading the socket, watch the take in the server's SQLite file until it ends.
        database = sqlite3.connect(tmp_path / "retake.sqlite3")
        for _ in range(1200):
            row = database.execute("SELECT state, finish_reason, error, frames FROM takes").fetchone()
            if row is not None and row[0] == "done":
                break
            await asyncio.sleep(0.1)
        database.close()
        assert row[:2] == ("done", "error") and "not reading" in row[2]
        assert row[3] < 1200  # stopped early
        client.transport.abort()  # a close handshake would wait behind the audio still buffered

    run(main())

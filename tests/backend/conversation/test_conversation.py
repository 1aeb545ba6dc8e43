"""Live conversations on /converse, on a real server with the tiny PersonaPlex checkpoint: the agent
answers tick by tick exactly as the engine does offline, slots are taken and freed, and bad input
gets an error that says what to change."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import websockets
from live_server import CONVERSATION_SLOTS, LiveServer, fetch, run

from backend.tools.conversation_load import user_voice
from backend.transport import unpack_audio_frame
from engine.personaplex.engine import DEFAULT_PERSONA, PersonaPlex

SLOTS = CONVERSATION_SLOTS


def user_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """int16 [seconds * 24000]: someone talking (retake loadtest --converse's user)."""
    return user_voice(seconds, 24000, seed)


async def open_talk(url: str, **fields: object) -> tuple[Any, dict[str, Any]]:
    socket = await websockets.connect(url, max_size=None)
    await socket.send(json.dumps({"type": "converse.open", **fields}))
    return socket, json.loads(await socket.recv())


async def listen(socket: Any, user: np.ndarray, frame_samples: int = 1920) -> tuple[list[bytes], list[dict]]:
    """Wait for listening, send the user's audio at once, collect one agent frame per user frame."""
    assert json.loads(await socket.recv()) == {"type": "converse.listening"}
    await socket.send(user.astype("<i2").tobytes())
    frames: list[bytes] = []
    texts: list[dict] = []
    while len(frames) < len(user) // frame_samples:
        message = await socket.recv()
        if isinstance(message, bytes):
            frames.append(message)
        else:
            texts.append(json.loads(message))
    await socket.send(json.dumps({"type": "ping"}))  # the last frame's text comes before the pong
    while (message := json.loads(await socket.recv())) != {"type": "pong"}:
        texts.append(message)
    return frames, texts


def test_the_agent_answers_as_the_engine_does_offline(talk_server: LiveServer,
                                                      personaplex_checkpoint: Path) -> None:
    user = user_audio(2.0)  # 25 ticks

    async def main() -> tuple[dict[str, Any], list[bytes], list[dict]]:
        socket, ready = await open_talk(talk_server.converse, seed=7)
        frames, texts = await listen(socket, user)
        await socket.close()
        return ready, frames, texts

    ready, frames, texts = run(main())
    assert ready == {"type": "converse.ready", "sample_rate": 24000, "frame_samples": 1920, "voice": "NATF2",
                     "voices": ["NATF2"], "persona": DEFAULT_PERSONA, "demo_weights": True}
    heard = [unpack_audio_frame(frame) for frame in frames]
    assert [(h.take_id, h.seq, h.start_sample, h.last) for h, _ in heard] == [(0, k, 1920 * k, False)
                                                                            for k in range(25)]
    live = np.concatenate([np.frombuffer(pcm, dtype="<i2") for _, pcm in heard])

    # The same conversation offline: a fresh engine of as many slots, the same seed, the other slot idle.
    engine = PersonaPlex.load(personaplex_checkpoint, device="cpu", slots=SLOTS)
    engine.set_sampling(engine.sampling.__class__(seed=7))
    engine.start(0, DEFAULT_PERSONA, engine.voice())
    silence = np.zeros((SLOTS, 1920), dtype=np.float32)
    while engine.prefilling(0):
        engine.step(silence, set())  # the prompt read, a chunk a tick, nobody moved (as the server does)
    expected, pieces = [], []
    for k in range(25):
        batch = silence.copy()
        batch[0] = user[1920 * k: 1920 * (k + 1)] / 32768.0
        out = engine.step(batch)[0]
        assert out is not None
        expected.append(np.round(np.clip(out.pcm, -1, 1) * 32767).astype(np.int16))
        if out.text is not None:
            pieces.append({"type": "converse.text", "tick": k, "text": out.text})
    np.testing.assert_array_equal(live, np.concatenate(expected))
    assert texts == pieces and pieces  # the tiny agent says something (random pieces)


async def open_when_free(url: str, **fields: object) -> tuple[Any, dict[str, Any]]:
    """open_talk, again while busy: the server frees a slot just after the close handshake."""
    for _ in range(50):
        socket, ready = await open_talk(url, **fields)
        if ready.get("code") != "busy":
            break
        await socket.close()
        await asyncio.sleep(0.05)
    return socket, ready


def test_slots_are_taken_and_freed(talk_server: LiveServer) -> None:
    async def main() -> None:
        socket, _ = await open_talk(talk_server.converse)
        await socket.close()  # gone during its system prompt: the slot is free again
        talks = [await open_when_free(talk_server.converse) for _ in range(SLOTS)]
        assert all(ready["type"] == "converse.ready" for _, ready in talks)
        assert f"retake_conversations {SLOTS}\n" in (await fetch(f"{talk_server.http}/metrics")).decode()
        socket, refused = await open_talk(talk_server.converse)
        assert refused["code"] == "busy"
        await socket.wait_closed()
        assert socket.close_code == 1013
        # Conversations that end free their slots for the next ones, which are heard. (While another
        # conversation listens, a system prompt runs at its pace, one tick per 80 ms: close both.)
        for socket, _ in talks:
            await socket.close()
        again, ready = await open_when_free(talk_server.converse, seed=1)
        assert ready["type"] == "converse.ready"
        frames, _ = await listen(again, user_audio(0.5, seed=1))
        assert len(frames) == 6
        await again.close()

    run(main())


@pytest.mark.parametrize(("fields", "says"), [
    ({"voice": "../../etc/passwd"}, "unknown voice '../../etc/passwd'; the voices are NATF2"),
    ({"voice": 3}, "voice must be a voice name (a string)"),
    ({"persona": "x" * 5000}, "persona must be a string of at most 4000 characters"),
    ({"persona": "talk " * 3000}, "persona must be a string of at most 4000 characters"),
    ({"seed": -1}, "seed must be a non-negative integer"),
])
def test_a_bad_open_says_what_to_change_and_the_socket_stays(talk_server: LiveServer, fields: dict,
                                                             says: str) -> None:
    async def main() -> None:
        socket, reply = await open_talk(talk_server.converse, **fields)
        assert reply == {"type": "error", "code": "bad_field", "message": says}
        await socket.send(json.dumps({"type": "converse.open"}))
        assert json.loads(await socket.recv())["type"] == "converse.ready"
        await socket.close()

    run(main())


def test_a_ping_before_the_open_gets_its_pong_and_the_open_still_works(talk_server: LiveServer) -> None:
    async def main() -> None:
        socket = await websockets.connect(talk_server.converse, max_size=None)
        for _ in range(2):
            await socket.send(json.dumps({"type": "ping"}))
            assert json.loads(await socket.recv()) == {"type": "pong"}
        await socket.send(b"\x00\x01")  # audio before the open is still refused
        reply = json.loads(await socket.recv())
        assert reply["code"] == "bad_field" and "converse.open" in reply["message"], reply
        await socket.send(json.dumps({"type": "converse.open"}))
        assert json.loads(await socket.recv())["type"] == "converse.ready"
        await socket.close()

    run(main())


def test_a_persona_too_long_for_the_context_is_refused(talk_server: LiveServer) -> None:
    async def main() -> None:
        socket, reply = await open_talk(talk_server.converse, persona="word " * 790)
        assert reply["code"] == "bad_field" and "context" in reply["message"], reply
        await socket.close()

    run(main())


def test_bad_audio_and_messages_get_errors(talk_server: LiveServer) -> None:
    async def main() -> None:
        socket, _ = await open_talk(talk_server.converse)
        assert json.loads(await socket.recv()) == {"type": "converse.listening"}
        await socket.send(b"\x01\x02\x03")
        assert json.loads(await socket.recv())["message"] == (
            "audio frames must hold whole 16-bit samples (an even number of bytes)")
        await socket.send("{oops")
        assert json.loads(await socket.recv())["code"] == "bad_json"
        await socket.send(json.dumps({"type": "take.start"}))
        assert json.loads(await socket.recv())["code"] == "unknown_type"
        await socket.send(json.dumps({"type": "ping"}))
        assert json.loads(await socket.recv()) == {"type": "pong"}
        # Audio far faster than it can be heard: too_fast, then the socket closes.
        for _ in range(40):
            await socket.send(user_audio(4.0).tobytes())
        codes = []
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                message = await socket.recv()
                if isinstance(message, str) and json.loads(message)["type"] == "error":
                    codes.append(json.loads(message)["code"])
        assert codes == ["too_fast"] and socket.close_code == 1008

    run(main())


def test_the_page_learns_voices_persona_and_limits_before_talking(talk_server: LiveServer, server: LiveServer,
                                                                  ) -> None:
    async def main() -> None:
        info = json.loads(await fetch(f"{talk_server.http}/converse/info"))
        assert info == {
            "converse": True, "voices": ["NATF2"], "voice": "NATF2", "persona": DEFAULT_PERSONA,
            "max_persona_chars": 4000, "max_clip_seconds": 30.0, "sample_rate": 24000, "frame_samples": 1920,
            "demo_weights": True,
        }
        # What converse.ready says once a conversation starts agrees with it.
        socket, ready = await open_when_free(talk_server.converse)
        assert (ready["voices"], ready["voice"], ready["persona"]) == (info["voices"], info["voice"], info["persona"])
        await socket.close()
        assert json.loads(await fetch(f"{server.http}/converse/info")) == {"converse": False}

    run(main())


def test_a_server_without_conversations_says_so(server: LiveServer) -> None:
    async def main() -> None:
        socket = await websockets.connect(server.converse)
        reply = json.loads(await socket.recv())  # at once: nothing to open
        assert reply["code"] == "converse_off" and "retake serve --converse" in reply["message"]
        await socket.wait_closed()
        assert socket.close_code == 1008

    run(main())


def wait_until_idle(server: LiveServer) -> None:
    deadline = time.monotonic() + 60  # the earlier tests' conversations free their slots just after they close
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as response:
            if "retake_conversations 0\n" in response.read().decode():
                return
        time.sleep(0.05)
    raise AssertionError("the server still holds conversations 60 s after their clients left")


def test_loadtest_talks_in_real_time_and_reports(talk_server: LiveServer, capsys: pytest.CaptureFixture[str],
                                                 ) -> None:
    """`retake loadtest --converse`: every conversation's ticks come back in order and are reported;
    a conversation past the slots is a reported failure, not a crash."""
    from backend.cli import main

    wait_until_idle(talk_server)
    url = talk_server.converse.removesuffix("/converse") + "/ws"
    assert main(["loadtest", "--converse", "--url", url, "--sessions", str(SLOTS), "--seconds", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{SLOTS} conversations x 1 s of talking against {talk_server.converse}: {SLOTS} done" in out
    for row in ("system prompt", "tick latency", "longest gap vs playback"):
        assert row in out
    wait_until_idle(talk_server)  # the first run's slots are let go after its sockets close
    assert main(["loadtest", "--converse", "--url", url, "--sessions", str(SLOTS + 1), "--seconds", "1",
                 "--stagger-ms", "300"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED conversation {SLOTS}: RuntimeError: busy: all {SLOTS} conversation slots are in use" in out



def test_loadtest_measures_a_join_while_the_others_talk(talk_server: LiveServer, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`--join 1`: one more conversation opens while the first talks; its system prompt and the
    talker's tick latency meanwhile are reported, on the terminal and in --json."""
    from backend.cli import main

    wait_until_idle(talk_server)
    url = talk_server.converse.removesuffix("/converse") + "/ws"
    report = tmp_path / "converse.json"
    assert main(["loadtest", "--converse", "--url", url, "--sessions", "1", "--seconds", "3", "--join", "1",
                 "--join-after", "0.5", "--aligned", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 joined while they talked" in out
    assert "system prompt, joining" in out and "tick latency during joins" in out
    data = json.loads(report.read_text())
    assert data["joins"] == 1 and data["failures"] == [] and data["kept_real_time"] in (0, 1) and data["aligned"]
    assert data["joining_prompt_ms"]["p50"] > 0 and data["tick_latency_ms"]["p99"] > 0
    assert data["tick_latency_during_joins_ms"] is not None  # the talker sent frames during the join


def test_loadtest_conversations_talk_together_however_far_apart_they_open(talk_server: LiveServer, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Opened 1.5 s apart to talk 1 s each, the conversations still talk at the same time: each streams
    silence from `listening` until all listen, and what is measured starts there."""
    from backend.cli import main

    wait_until_idle(talk_server)
    url = talk_server.converse.removesuffix("/converse") + "/ws"
    report = tmp_path / "converse.json"
    assert main(["loadtest", "--converse", "--url", url, "--sessions", str(SLOTS), "--seconds", "1",
                 "--stagger-ms", "1500", "--json", str(report)]) == 0
    assert "all talking at once for" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["failures"] == [] and data["all_talking_s"] >= 0.5  # apart, they would not overlap at all
    assert len(data["tick_latency_ms"]) == 4


def test_loadtest_spreads_conversations_over_client_processes(talk_server: LiveServer, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`--processes 2`: each conversation in a client process of its own, opened 1.5 s apart, still
    talks at the same time as the other (the processes meet once all listen); the report merges
    both and gives each process's event loop lag."""
    from backend.cli import main

    wait_until_idle(talk_server)
    url = talk_server.converse.removesuffix("/converse") + "/ws"
    report = tmp_path / "converse.json"
    assert main(["loadtest", "--converse", "--url", url, "--sessions", "2", "--seconds", "1",
                 "--stagger-ms", "1500", "--processes", "2", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "2 done" in out and "(2 client processes)" in out and "client event loop lag" in out
    data = json.loads(report.read_text())
    assert data["failures"] == [] and data["processes"] == 2 and data["all_talking_s"] >= 0.5
    assert data["client_loop_lag_ms"]["max"] >= 0 and data["tick_latency_ms"]["p50"] > 0
    assert main(["loadtest", "--converse", "--url", url, "--processes", "0"]) == 2
    assert "--processes must be at least 1" in capsys.readouterr().err


def test_loadtest_microphones_start_at_phases_spread_over_the_frame() -> None:
    """Without --aligned each conversation's 80 ms schedule starts at a phase of its own: for any
    number of conversations the phases leave no gap wider than twice an even share of the frame."""
    from backend.tools.conversation_load import microphone_phase

    for n in (2, 3, 8, 64, 127):
        phases = sorted(microphone_phase(i) for i in range(n))
        assert all(0 <= p < 1 for p in phases) and len(set(phases)) == n
        gaps = [b - a for a, b in itertools.pairwise(phases)] + [1 - phases[-1] + phases[0]]
        assert max(gaps) <= 2 / n  # the golden-ratio sequence: no gap wider than twice an even share


def wav_file(pcm: np.ndarray, rate: int) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, pcm, rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


def test_a_voice_clip_becomes_the_agents_voice(talk_server: LiveServer) -> None:
    """A clip (any rate: it is resampled to 24 kHz) is Mimi-encoded as the voice prompt; the
    conversation then answers like any other. Bad clips say what to change."""
    clip = wav_file(user_audio(1.5, seed=5).astype(np.float32) / 32768, 16000)

    async def main() -> None:
        # The tiny model's context is 96 ticks: a short persona leaves room for the clip's frames.
        socket, ready = await open_when_free(talk_server.converse, voice_clip=clip, persona="Be brief.", seed=2)
        assert (ready["type"], ready["voice"]) == ("converse.ready", "your clip"), ready
        frames, _ = await listen(socket, user_audio(0.5))
        assert len(frames) == 6
        await socket.close()
        for fields, says in [
            ({"voice_clip": "%%%"}, "voice_clip must be a WAV or FLAC file, base64-encoded"),
            ({"voice_clip": clip, "voice": "NATF2"}, "give a voice or a voice_clip, not both"),
            ({"voice_clip": base64.b64encode(b"not audio").decode()},
             "the clip is not a WAV or FLAC file this server can read (Format not recognised); give a WAV or FLAC "
             "file"),
            ({"voice_clip": wav_file(np.zeros(24000 * 31, np.float32), 24000)},
             "the clip is 31.0 s long; the limit is 30 s, send a shorter clip"),
            ({"voice_clip": wav_file(np.zeros(960, np.float32), 24000)},
             "a voice clip must be 80 ms to 30 s long; this one is 0.04 s"),
        ]:
            socket, reply = await open_when_free(talk_server.converse, **fields)
            assert reply["code"] == "bad_field" and says in reply["message"], reply
            assert "BytesIO" not in reply["message"]  # no Python object in a director's error
            await socket.close()

    run(main())


def prompts_started(metrics: str) -> dict[str, int]:
    return {how: int(count) for how, count in
            re.findall(r'^retake_conversation_prompts_total\{how="(\w+)"\} (\d+)$', metrics, re.M)}


def test_a_persona_and_voice_read_before_are_copied_and_counted(talk_server: LiveServer) -> None:
    persona = "You answer every question with a question."  # not read by any other test

    async def main() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        before = prompts_started((await fetch(f"{talk_server.http}/metrics")).decode())
        counts = []
        for _ in range(2):
            socket, ready = await open_when_free(talk_server.converse, persona=persona)
            assert ready["type"] == "converse.ready"
            assert json.loads(await socket.recv()) == {"type": "converse.listening"}
            counts.append(prompts_started((await fetch(f"{talk_server.http}/metrics")).decode()))
            await socket.close()
        return before, counts[0], counts[1]

    before, first, second = run(main())
    assert first["read"] == before.get("read", 0) + 1 and first.get("copied", 0) == before.get("copied", 0)
    assert second["copied"] == first.get("copied", 0) + 1 and second["read"] == first["read"]

"""Directing takes on a real server: streaming, export, keep/retake history, cancel, deadline."""

from __future__ import annotations

import base64
import io
import re
import urllib.request
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from live_server import LiveServer, fetch, run, warms_ended

from backend.directing.jobs import SilenceGuard
from backend.directing.loop import EngineLoop
from backend.schema import takes
from backend.store import Store
from backend.tools.client import Director, TakeResult

SHORT = {"max_new_tokens": 24}


def export(server: LiveServer, session_id: str, take_id: int) -> np.ndarray:
    url = f"{server.http}/sessions/{session_id}/takes/{take_id}.wav"
    headers = Director.export_headers(session_id)
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
        assert response.headers["Content-Type"] == "audio/wav"
        samples, rate = sf.read(io.BytesIO(response.read()), dtype="int16")
    assert rate == 44100
    return samples


def check_stream(take: TakeResult) -> None:
    """Headers are consistent: one take id, seq 0.., contiguous samples, the total take.done reports."""
    position = 0
    for seq, frame in enumerate(take.frames):
        header = frame.header
        assert (header.kind, header.take_id, header.seq, header.start_sample) == (1, take.take_id, seq, position)
        assert len(frame.pcm) > 0 or seq == len(take.frames) - 1  # only the final window may be empty
        position += len(frame.pcm)
    done = take.done
    assert done["samples"] == position
    assert done["frames"] == done["timings"]["frames"]  # type: ignore[index]
    assert position == int(done["frames"]) * 2048  # type: ignore[call-overload]
    assert [frame.header.last for frame in take.frames] == [False] * (len(take.frames) - 1) + [True]


def test_take_streams_windows_equal_to_its_export(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        assert ready["resumed"] is False and ready["engine"] == "drama3" and ready["demo_weights"] is True
        assert (ready["sample_rate"], ready["frame_samples"]) == (44100, 2048)
        assert ready["takes"] == [] and ready["lines"] == [] and ready["history"] == []
        take = await director.take("line-1", "Places, everyone.", sampling={**SHORT, "seed": 3}, ref="t1")
        kinds = [m["type"] for m in take.messages]
        assert kinds == ["take.queued", "take.started", "history", "take.done"]
        assert take.messages[0]["ref"] == "t1" and take.messages[0]["line_id"] == "line-1"
        assert take.of_type("history")[0] == {"type": "history", "take_ids": [], "dropped": [],
                                              "take_id": take.take_id, "hears": None, "unkept": []}
        done = take.done
        assert done["finish_reason"] in ("stop", "length") and done["error"] is None and done["attempts"] == 1
        timings = done["timings"]
        assert isinstance(timings, dict)
        assert timings["prompt_rows"] > 0 and timings["first_audio_ms"] is not None
        # The first audio left the server after the engine made it (its window stored first); both
        # from the take entering the engine's queue (queue_ms whole milliseconds: 1 ms of rounding).
        engine_ms = timings["queue_ms"] + timings["first_audio_ms"]  # type: ignore[operator]
        assert engine_ms - 1 <= timings["first_audio_sent_ms"] < 60_000  # type: ignore[operator]
        assert take.frames, "no audio"
        check_stream(take)
        np.testing.assert_array_equal(export(server, str(ready["session_id"]), take.take_id), take.pcm)
        await director.close()

    run(main())


def test_keep_then_retake_conditions_on_the_kept_take(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        short = await director.take("line-1", "Who goes there?", sampling={"max_new_tokens": 8, "seed": 1})
        longer = await director.take("line-1", "Who goes there?", sampling={"max_new_tokens": 20, "seed": 2})
        f_short, f_long = int(short.done["frames"]), int(longer.done["frames"])  # type: ignore[call-overload]
        assert f_short > 0 and f_long > 0 and f_short != f_long
        history = await director.request({"type": "take.keep", "take_id": short.take_id}, "history")
        assert history == {"type": "history", "take_ids": [short.take_id], "dropped": [], "take_id": None,
                           "hears": {"line-1": 0}, "unkept": []}

        line = {"sampling": {"max_new_tokens": 4, "seed": 5}}
        retake = await director.take("line-2", "Only me.", **line)  # history "kept": the short take
        assert retake.of_type("history")[0]["take_ids"] == [short.take_id]
        alone = await director.take("line-2", "Only me.", history=[], **line)
        with_long = await director.take("line-2", "Only me.", history=[longer.take_id], **line)

        def rows(take: TakeResult) -> int:
            return int(take.done["timings"]["prompt_rows"])  # type: ignore[index]

        # The kept take's frames are prompt rows of the retake: the same turn with another take's
        # frames differs by exactly the difference in frames; text rows come on top of them.
        assert rows(with_long) - rows(retake) == f_long - f_short
        assert rows(retake) - rows(alone) > f_short

        dropped = await director.request({"type": "take.drop", "take_id": short.take_id}, "history")
        assert dropped["take_ids"] == []
        again = await director.take("line-2", "Only me.", **line)
        assert rows(again) == rows(alone)
        await director.close()

    run(main())


def test_cancel_stops_a_take_mid_stream(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        take = await director.start("line-1", "A long speech that goes on.", sampling={"seed": 11})
        first = await director.receive()
        while not (hasattr(first, "header")):
            take.messages.append(first)  # type: ignore[arg-type]
            first = await director.receive()
        director.pending.insert(0, first)
        await director.send({"type": "take.cancel", "take_id": take.take_id})
        await director.finish(take)
        done = take.done
        assert done["finish_reason"] == "cancelled"
        assert 0 < int(done["frames"]) < int(ready["limits"]["max_new_tokens"])  # type: ignore[index, call-overload]
        check_stream(take)
        np.testing.assert_array_equal(export(server, str(ready["session_id"]), take.take_id), take.pcm)
        await director.close()

    run(main())


def test_deadline_ends_a_take(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        take = await director.take("line-1", "A long speech that goes on.", sampling={"seed": 11}, deadline_ms=400)
        assert take.messages[0]["deadline_ms"] == 400
        done = take.done
        assert done["finish_reason"] == "deadline"
        assert int(done["frames"]) < int(ready["limits"]["max_new_tokens"])  # type: ignore[index, call-overload]
        check_stream(take)
        await director.close()

    run(main())


def test_a_new_take_supersedes_the_running_one(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        first = await director.start("line-1", "A long speech that goes on.", sampling={"seed": 11})
        second = await director.start("line-1", "Shorter.", sampling={**SHORT, "seed": 1})
        await director.finish(first)
        await director.finish(second)
        assert first.done["finish_reason"] == "cancelled"
        assert second.done["finish_reason"] in ("stop", "length")
        check_stream(second)
        await director.close()

    run(main())


@pytest.mark.slow
def test_history_past_the_row_limit_drops_the_oldest_turns(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        # A prompt of the row limit, cut at ~150 turn ends (prefix.py), prefilled cold: a minute or more on a
        # loaded CPU (docs/perf.md), so its messages get more than the default minute.
        director.patience_s = 600
        ready = await director.open()
        turn = await director.take("line-1", "Again and again.", sampling={"max_new_tokens": 12, "seed": 1})
        frames = int(turn.done["frames"])  # type: ignore[call-overload]
        limit = int(ready["limits"]["max_prompt_rows"])  # type: ignore[index, call-overload]
        turns = limit // frames + 8  # the same take as every turn: more rows than the limit holds
        take = await director.take("line-2", "Enough.", history=[turn.take_id] * turns,
                                   sampling={"max_new_tokens": 2, "seed": 1})
        history = take.of_type("history")[0]
        used, dropped = history["take_ids"], history["dropped"]
        assert isinstance(used, list) and isinstance(dropped, list)
        assert dropped and used and len(used) + len(dropped) == turns
        assert take.done["finish_reason"] in ("stop", "length")
        rows = int(take.done["timings"]["prompt_rows"])  # type: ignore[index]
        assert limit - frames - 64 < rows <= limit  # as many turns as fit
        await director.close()

    run(main())


def test_the_servers_row_limit_drops_the_oldest_turns_and_the_take_remembers_them(make_server: Any) -> None:
    """A server's max_prompt_rows below the engine's is the one a take's prompt is cut at; the takes
    left out are in the take's `history` message and, after a resume, in its TakeInfo."""
    server = make_server(limits={"max_prompt_rows": 200})

    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        turn = await director.take("line-1", "Again and again.", sampling={"max_new_tokens": 12, "seed": 1})
        other = await director.take("line-2", "Once more.", sampling={"max_new_tokens": 12, "seed": 2})
        heard = [turn.take_id] * 8 + [other.take_id]  # more rows than 200: the oldest go
        take = await director.take("line-3", "Enough.", history=heard, sampling={"max_new_tokens": 2, "seed": 1})
        (history,) = take.of_type("history")
        used, dropped = history["take_ids"], history["dropped"]
        assert isinstance(used, list) and isinstance(dropped, list) and dropped and used, history
        assert used + dropped == heard[len(dropped):] + heard[:len(dropped)] and used[-1] == other.take_id
        assert int(take.done["timings"]["prompt_rows"]) <= 200  # type: ignore[index, call-overload]
        await director.close()
        again = await Director.connect(server.ws)
        resumed = await again.open(str(ready["session_id"]))
        info = next(t for t in resumed["takes"] if t["take_id"] == take.take_id)  # type: ignore[union-attr]
        assert (info["history"], info["dropped"]) == (used, dropped)
        await again.close()

    run(main())


def test_an_ended_take_keeps_its_audio_and_exports_it_without_the_engine(make_server: Any) -> None:
    """The audio that streamed is stored with the take when it ends; the export is that audio, read
    back from the store: it does not need the codes (here erased), so it never vocodes again."""
    server = make_server(silence=SilenceGuard(retries=0))

    async def main() -> tuple[str, TakeResult]:
        director = await Director.connect(server.ws)
        ready = await director.open()
        take = await director.take("line-1", "Places, everyone.", sampling={**SHORT, "seed": 4})
        await director.close()
        return str(ready["session_id"]), take

    session_id, take = run(main())
    store = Store(server.settings.database)
    try:
        kept = store.take_audio(take.take_id)
        assert kept is not None
        np.testing.assert_array_equal(kept[0], take.pcm)
        assert kept[1] == 44100
        with store.engine.begin() as conn:  # without codes, only the kept audio can answer
            conn.execute(takes.update().where(takes.c.take_id == take.take_id).values(codes=None, codebooks=None))
    finally:
        store.close()
    np.testing.assert_array_equal(export(server, session_id, take.take_id), take.pcm)
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert 'retake_take_exports_total{audio="kept"} 1\n' in metrics
    assert 'retake_take_exports_total{audio="vocoded"} 0\n' in metrics


def test_a_retake_restores_its_prompt_from_the_prefix_cache(server: LiveServer) -> None:
    """The same line retaken with the same seed: the whole prompt comes from the engine's prefix
    cache (timings.cached_rows), the take is the one the first prefill made, /metrics counts it."""

    async def main() -> tuple[TakeResult, TakeResult]:
        director = await Director.connect(server.ws)
        await director.open()
        first = await director.take("line-1", "Once more, from the top.", sampling={**SHORT, "seed": 7})
        again = await director.take("line-1", "Once more, from the top.", sampling={**SHORT, "seed": 7})
        await director.close()
        return first, again

    first, again = run(main())
    timings = again.done["timings"]
    assert isinstance(timings, dict) and timings["cached_rows"] == timings["prompt_rows"] > 0
    np.testing.assert_array_equal(again.pcm, first.pcm)
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    hits = re.search(r'^retake_prefix_cache_lookups_total\{result="hit"\} (\d+)$', metrics, re.M)
    assert hits is not None and int(hits.group(1)) >= 1
    in_place = re.search(r'^retake_prefix_cache_rows_in_place_total (\d+)$', metrics, re.M)
    assert in_place is not None and int(in_place.group(1)) > 0  # the retake's history, in its slot still
    held = re.search(r'^retake_prefix_cache_bytes\{memory="device"\} (\d+)$', metrics, re.M)
    assert held is not None and int(held.group(1)) > 0


async def warms(server: LiveServer) -> dict[str, int]:
    """Prefix warms ended, by finish reason (/metrics; the engine loop is shared by the tests' servers)."""
    metrics = (await fetch(f"{server.http}/metrics")).decode()
    return {reason: int(n) for reason, n in re.findall(r'^retake_prefix_warms_total\{finish_reason="(\w+)"\} (\d+)$',
                                                       metrics, re.M)}


def test_a_scene_prefills_each_kept_take_once_as_it_moves_line_by_line(make_server: Any,
                                                                       engine_loop: EngineLoop) -> None:
    """Line by line, each keep then the next line (history "kept"): the keep warms the next
    line's prompt into the prefix cache (system message, kept takes and the script's text of
    the line), so a take of the line as written prefills nothing; a line edited is warmed
    again; a take with words the script does not hold prefills only its line; the restored
    takes sound as prefilled from row 0."""
    server = make_server(silence=SilenceGuard(retries=0))
    sampling = {"sampling": {"max_new_tokens": 6, "seed": 5}}
    script = [("p1", "The curtain is up, and the whole company waits in the wings, prefix."),
              ("p2", "Nobody moves, prefix."), ("p3", "Nobody moves at all, prefix.")]
    edited, spoken = "Nobody moves, not one of them, prefix.", "Somebody coughs, prefix."

    async def main() -> tuple[list[TakeResult], dict[str, int], dict[str, int]]:
        await warms_ended(engine_loop)  # (the engine loop is shared: another test's warm ends first)
        before = await warms(server)
        director = await Director.connect(server.ws)
        await director.open()
        for line_id, text in script:  # p1, the line to take next, is warmed as it is written
            await director.request({"type": "line.set", "line_id": line_id, "text": text}, "script")
        takes = []
        for line_id, text in script[:2]:
            await warms_ended(engine_loop)
            take = await director.take(line_id, text, **sampling)
            takes.append(take)
            await director.request({"type": "take.keep", "take_id": take.take_id}, "history")  # warms the next
        await warms_ended(engine_loop)
        await director.request({"type": "line.set", "line_id": "p3", "text": edited}, "script")  # warmed again
        await warms_ended(engine_loop)
        takes.append(await director.take("p3", edited, **sampling))
        takes.append(await director.take("p3", spoken, **sampling))  # words the script does not hold
        takes.append(await director.take("p3", spoken, **sampling))  # ... retaken
        await director.close()
        return takes, before, await warms(server)

    takes, before, after = run(main())
    assert [len(t.of_type("history")[0]["take_ids"]) for t in takes] == [0, 1, 2, 2, 2]  # type: ignore[arg-type]
    first, second, third, other, retake = [take.done["timings"] for take in takes]
    assert all(isinstance(t, dict) for t in (first, second, third, other, retake))
    # Each line as the script held it when warmed: its whole prompt restored.
    for whole in (first, second, third):
        assert whole["cached_rows"] == whole["prompt_rows"] > 0  # type: ignore[index]
    assert first["prompt_rows"] < second["prompt_rows"] < third["prompt_rows"]  # type: ignore[index]
    # Other words for p3: the system message and the kept takes restored, its line prefilled.
    assert 0 < other["cached_rows"] < other["prompt_rows"]  # type: ignore[index]
    assert third["prompt_rows"] - other["cached_rows"] < third["prompt_rows"] - second["prompt_rows"]  # type: ignore[index]
    assert retake["cached_rows"] == retake["prompt_rows"] == other["prompt_rows"]  # type: ignore[index]
    np.testing.assert_array_equal(takes[4].pcm, takes[3].pcm)  # same seed, same rows: the same take
    # p1 (written), p2 and p3 (kept before them), p3 edited; opening the session asks for p1 too
    # (no line yet: up to its system message, which p1's warm then holds or is held already).
    assert after["prefilled"] - before["prefilled"] >= 4


def test_a_line_too_long_to_take_is_not_warmed_and_its_take_says_why(make_server: Any, engine_loop: EngineLoop,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The line to take next, written past the server's prompt rows: its warm is refused in one log
    line (no traceback: it is the director's text, not a fault), and its take says what to change."""
    server = make_server(limits={"max_prompt_rows": 60}, silence=SilenceGuard(retries=0))
    text = "A line far too long for a prompt of sixty rows, " * 4

    async def main() -> dict[str, Any]:
        await warms_ended(engine_loop)
        director = await Director.connect(server.ws)
        await director.open()
        await director.request({"type": "line.set", "line_id": "long", "text": text}, "script")
        await warms_ended(engine_loop)
        take = await director.take("long", text, sampling=SHORT)
        await director.close()
        return take.done

    with caplog.at_level("INFO", logger="retake.loop"):
        done = run(main())
    assert done["finish_reason"] == "error" and "exceeds the maximum allowed length of 60 rows" in str(done["error"])
    refused = [r for r in caplog.records if "did not warm the prefix cache" in r.getMessage()]
    assert refused and "60 rows" in refused[-1].getMessage() and refused[-1].exc_info is None
    assert not [r for r in caplog.records if "Traceback" in r.getMessage()]


def test_a_voice_set_warms_the_system_message_of_the_line_to_take_next(make_server: Any,
                                                                       engine_loop: EngineLoop) -> None:
    """A voice's reference codes fill the system message, which no take has prefilled yet: the
    server warms the line to take next with it when the voice is set, so the first take of the
    line as written restores its whole prompt (the line's warm before the voice does not serve it)."""
    server = make_server(silence=SilenceGuard(retries=0))
    t = np.arange(int(44100 * 0.5)) / 44100
    wav = io.BytesIO()
    sf.write(wav, (0.4 * np.sin(2 * np.pi * 313.0 * t)).astype(np.float32), 44100, format="WAV", subtype="PCM_16")
    voice = {"type": "voice.set", "references": [{"audio": base64.b64encode(wav.getvalue()).decode(),
                                                  "text": "A voice no other test sets."}]}

    async def main() -> tuple[TakeResult, TakeResult]:
        director = await Director.connect(server.ws)
        await director.open()
        await director.request({"type": "line.set", "line_id": "w1", "text": "Warm before the take."}, "script")
        await director.request(voice, "voice.ready")
        await warms_ended(engine_loop)
        first = await director.take("w1", "Warm before the take.", sampling={**SHORT, "seed": 2})
        again = await director.take("w1", "Warm before the take.", sampling={**SHORT, "seed": 2})
        await director.close()
        return first, again

    first, again = run(main())
    timings, whole = first.done["timings"], again.done["timings"]
    assert isinstance(timings, dict) and isinstance(whole, dict)
    assert 0 < timings["cached_rows"] == timings["prompt_rows"] == whole["cached_rows"]
    np.testing.assert_array_equal(first.pcm, again.pcm)

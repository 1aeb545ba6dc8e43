"""A scene's cast, notes and ratings, and the length guard, on a real server: characters with their
own voices, each line said by one, a take's prompt laid out with its character and the scene's
history (checked against the engine's own prompt builder), stored and back after a resume."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from live_server import LiveServer, run, warms_ended
from test_sessions import clip

from backend.directing.length_guard import GUARD_BASE_S, GUARD_S_PER_CHAR, guard_frames, spoken_characters
from backend.directing.loop import EngineLoop
from backend.tools.client import Director
from engine import Character, HistoryTurn, Sampling

SHORT = {"sampling": {"max_new_tokens": 10, "seed": 6}}
MARA = {"description": "a tired lighthouse keeper, low and slow", "scene": "A storm at night."}
BO = {"description": "a young sailor, quick and bright"}


async def cast(director: Director, message: dict[str, Any]) -> list[dict[str, Any]]:
    reply = await director.request({**message, "ref": "c"}, "cast")
    assert reply["ref"] == "c"
    return reply["characters"]  # type: ignore[return-value]


def test_a_scene_of_two_characters(server: LiveServer, engine_loop: EngineLoop) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        assert ready["cast"] == [] and ready["name"] == ""
        members = await cast(director, {"type": "cast.set", "character_id": "mara", "name": "Mara", "voice": MARA})
        members = await cast(director, {"type": "cast.set", "character_id": "bo", "name": "Bo", "voice": BO})
        placed = [(m["character_id"], m["name"], m["position"]) for m in members]
        assert placed == [("mara", "Mara", 0), ("bo", "Bo", 1)]
        assert members[0]["voice"]["character"] == {"name": "Mara", **MARA}
        mara_voice, bo_voice = members[0]["voice"]["voice_id"], members[1]["voice"]["voice_id"]

        # Line 1 has no character of its own: the scene's first says it. Line 2 is Bo's.
        script = await director.request({"type": "line.set", "line_id": "l1", "text": "Who goes there?"}, "script")
        assert script["lines"][0]["character_id"] is None
        script = await director.request({"type": "line.set", "line_id": "l2", "text": "A friend.",
                                         "character_id": "bo"}, "script")
        assert script["lines"][1]["character_id"] == "bo"
        first = await director.take("l1", "Who goes there?", **SHORT)
        queued = first.messages[0]
        assert (queued["character_id"], queued["voice_id"]) == ("mara", mara_voice)
        await director.request({"type": "take.keep", "take_id": first.take_id}, "history")
        second = await director.take("l2", "A friend.", **SHORT)
        assert (second.messages[0]["character_id"], second.messages[0]["voice_id"]) == ("bo", bo_voice)
        assert second.of_type("history")[0]["take_ids"] == [first.take_id]

        # Bo's prompt is the scene layout: both characters listed, Mara's kept take said by Mara.
        engine = engine_loop.engine
        assert engine is not None
        both = (Character("Mara", MARA["description"]), Character("Bo", BO["description"]))
        heard = HistoryTurn("Who goes there?", _codes(server, first.take_id), speaker="Mara")
        expected = engine.prompt("A friend.", Character("Bo", BO["description"], None, both), [heard],
                                 Sampling(max_new_tokens=10, seed=6))
        assert second.done["timings"]["prompt_rows"] == len(expected.rows)  # type: ignore[index]
        alone = engine.prompt("A friend.", Character("Bo", BO["description"]), [heard], Sampling())
        assert len(alone.rows) != len(expected.rows)  # the cast is in it

        # A renamed character keeps its voice; a removed one gives its lines back to the first.
        members = await cast(director, {"type": "cast.set", "character_id": "bo", "name": "Bo Tern"})
        assert (members[1]["name"], members[1]["voice"]["voice_id"]) == ("Bo Tern", bo_voice)
        await director.send({"type": "cast.delete", "character_id": "bo", "ref": "d"})
        assert [m["character_id"] for m in (await director.expect("cast"))["characters"]] == ["mara"]
        assert (await director.expect("script"))["lines"][1]["character_id"] is None

        # Refusals name what to change.
        for message, code, says in [
            ({"type": "line.set", "line_id": "l1", "text": "x", "character_id": "zed"}, "unknown_character",
             "character_id: 'zed' is not a character of the cast; add it with cast.set first"),
            ({"type": "cast.delete", "character_id": "zed"}, "unknown_character",
             "'zed' is not a character of the cast"),
            ({"type": "cast.set", "character_id": "twin", "name": "Mara"}, "bad_field",
             "name: the cast has a character called 'Mara' already"),
            ({"type": "cast.set", "character_id": "x", "name": "X", "voice": {"description": "a\nb"}}, "bad_field",
             "character.description must be a single line; remove the line breaks"),
        ]:
            error = await director.request({**message, "ref": "e"}, "error")
            assert (error["code"], error["message"], error["ref"]) == (code, says, "e")

        # Everything is stored: a resumed session has the cast, the lines' and the takes' characters.
        await director.close()
        again = await Director.connect(server.ws)
        resumed = await again.open(str(ready["session_id"]))
        assert [m["name"] for m in resumed["cast"]] == ["Mara"]
        takes = {t["take_id"]: t for t in resumed["takes"]}
        assert (takes[first.take_id]["character_id"], takes[second.take_id]["character_id"]) == ("mara", "bo")
        await again.close()

    run(main())


def _codes(server: LiveServer, take_id: int) -> np.ndarray:
    from backend.store import Store

    store = Store(server.settings.database)
    try:
        codes = store.take_codes(take_id)
        assert codes is not None
        return codes
    finally:
        store.close()


def test_a_cast_member_with_clips_and_one_too_many(make_server: Any) -> None:
    server = make_server(limits={"max_cast": 2})

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        members = await cast(director, {"type": "cast.set", "character_id": "a", "name": "Ann",
                                        "voice": {"references": [{"audio": clip(0.6), "text": "Hello there."}]}})
        assert [r["text"] for r in members[0]["voice"]["references"]] == ["Hello there."]
        assert members[0]["voice"]["references"][0]["frames"] > 0
        members = await cast(director, {"type": "cast.set", "character_id": "b", "name": "Ben", "voice": {}})
        assert members[1]["voice"] is None  # the engine's default voice
        take = await director.take("l1", "Hi.", **SHORT)
        assert take.messages[0]["character_id"] == "a" and take.done["finish_reason"] in ("stop", "length")
        error = await director.request({"type": "cast.set", "character_id": "c", "name": "Cy", "ref": "x"}, "error")
        assert error["code"] == "too_many_characters"
        assert error["message"] == "the cast holds 2 characters, the most a scene may; remove one first"
        bad = {"type": "cast.set", "character_id": "c", "name": "Cy", "ref": "y",
               "voice": {"references": [{"audio": "bm90IGF1ZGlv", "text": "Hi."}]}}
        await director.request({"type": "cast.delete", "character_id": "b"}, "cast")
        error = await director.request(bad, "error")
        assert error["code"] == "bad_reference"
        assert error["message"].startswith("voice.references.0.audio is not a WAV or FLAC file")
        assert (await director.request({"type": "ping", "t": 1}, "pong"))["t"] == 1  # the socket is still usable
        await director.close()

    run(main())


def test_notes_and_ratings_are_stored(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        take = await director.take("l1", "Again.", **SHORT)
        noted = await director.request({"type": "take.note", "take_id": take.take_id, "note": "Warmer.", "rating": 4,
                                        "ref": "n"}, "take.noted")
        assert noted == {"type": "take.noted", "take_id": take.take_id, "note": "Warmer.", "rating": 4, "ref": "n"}
        noted = await director.request({"type": "take.note", "take_id": take.take_id, "rating": 0}, "take.noted")
        assert (noted["note"], noted["rating"]) == ("Warmer.", 0)  # a field left out stays
        error = await director.request({"type": "take.note", "take_id": 999999, "note": "x"}, "error")
        assert error["code"] == "unknown_take"
        await director.close()
        again = await Director.connect(server.ws)
        resumed = await again.open(str(ready["session_id"]))
        stored = next(t for t in resumed["takes"] if t["take_id"] == take.take_id)
        assert (stored["note"], stored["rating"]) == ("Warmer.", 0)
        await again.close()

    run(main())


def test_the_length_guard_stops_a_take_that_outruns_its_line(server: LiveServer) -> None:
    rate = 44100 / 2048
    assert spoken_characters("<|speaker:0|> No.  <whisper>Go!</whisper> [sighs]") == len("No. Go! [sighs]")
    assert guard_frames("No.", rate, 1200) == math.ceil((GUARD_BASE_S + 3 * GUARD_S_PER_CHAR) * rate) == 56
    assert guard_frames("No.", rate, 20) == 20  # never past max_new_tokens

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        # The demo weights never stop by themselves: without a guard a take runs to max_new_tokens.
        guarded = await director.take("l1", "No.", sampling={"seed": 2})
        assert guarded.messages[0]["guard_frames"] == 56 == guarded.messages[0]["sampling"]["max_new_tokens"]
        assert (guarded.done["finish_reason"], guarded.done["frames"]) == ("length", 56)
        free = await director.take("l1", "No.", sampling={"seed": 2, "max_new_tokens": 70}, length_guard=False)
        assert free.messages[0]["guard_frames"] is None
        assert (free.done["finish_reason"], free.done["frames"]) == ("length", 70)
        # A max_new_tokens below the guard is the take's own limit, not the guard's.
        short = await director.take("l1", "No.", sampling={"seed": 2, "max_new_tokens": 12})
        assert short.messages[0]["guard_frames"] is None and short.done["frames"] == 12
        await director.close()

    run(main())


def test_a_cast_set_warms_the_line_to_take_next(server: LiveServer, engine_loop: EngineLoop) -> None:
    """A described character's system message lists the cast, which no take has prefilled yet: the
    server warms the line to take next with it when the cast is set, so the first take of the line
    as written restores its whole prompt; with other words, the cast's system message alone."""

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        director = await Director.connect(server.ws)
        await director.open()
        await director.request({"type": "line.set", "line_id": "c1", "text": "The lamp is lit."}, "script")
        await cast(director, {"type": "cast.set", "character_id": "ida", "name": "Ida",
                              "voice": {"description": "a harbour pilot no other test has, hoarse and calm"}})
        await warms_ended(engine_loop)  # the warm the cast.set asked for (before its reply)
        take = await director.take("c1", "The lamp is lit.", **SHORT)
        other = await director.take("c1", "The lamp is out.", **SHORT)
        await director.close()
        return take.done["timings"], other.done["timings"]  # type: ignore[return-value]

    timings, other = run(main())
    assert 0 < timings["cached_rows"] == timings["prompt_rows"]
    assert 0 < other["cached_rows"] < other["prompt_rows"]

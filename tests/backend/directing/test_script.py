"""The script on a real server: lines without takes, their order and deletions are stored, come
back after a reconnect and a server restart, and the "kept" history follows the script order."""

from __future__ import annotations

from typing import Any

from live_server import LiveServer, run

from backend.tools.client import Director, TakeResult

SHORT = {"sampling": {"max_new_tokens": 4, "seed": 3}}


def ids(script: dict[str, Any]) -> list[str]:
    return [line["line_id"] for line in script["lines"]]


async def line(director: Director, message: dict[str, Any]) -> dict[str, Any]:
    """Send a line message; its `script` reply (checked: it carries the message's ref)."""
    script = await director.request({**message, "ref": f"ref-{message['type']}"}, "script")
    assert script["ref"] == f"ref-{message['type']}"
    assert [line["position"] for line in script["lines"]] == list(range(len(script["lines"])))
    return script


async def write_script(director: Director) -> None:
    await line(director, {"type": "line.set", "line_id": "b", "text": "Then light it."})
    await line(director, {"type": "line.set", "line_id": "draft", "text": ""})  # not written yet
    await line(director, {"type": "line.set", "line_id": "a", "text": "The lamp is out.", "after": None})
    script = await line(director, {"type": "line.set", "line_id": "c", "text": "Who is there?", "after": "b"})
    assert ids(script) == ["a", "b", "c", "draft"]
    script = await line(director, {"type": "line.set", "line_id": "b", "text": "Then light it!"})  # text only
    assert ids(script) == ["a", "b", "c", "draft"]
    script = await line(director, {"type": "line.order", "line_ids": ["a", "draft", "c", "b"]})
    assert ids(script) == ["a", "draft", "c", "b"]
    script = await line(director, {"type": "line.delete", "line_id": "c"})
    assert script["lines"] == SCRIPT and script["history"] == []


SCRIPT = [{"line_id": "a", "text": "The lamp is out.", "position": 0, "character_id": None},
          {"line_id": "draft", "text": "", "position": 1, "character_id": None},
          {"line_id": "b", "text": "Then light it!", "position": 2, "character_id": None}]


def test_lines_without_takes_survive_a_reconnect_and_a_restart(make_server: Any, tmp_path: Any) -> None:
    first = make_server(data_dir=tmp_path)

    async def build() -> str:
        director = await Director.connect(first.ws)
        session_id = str((await director.open())["session_id"])
        await write_script(director)
        await director.close()
        again = await Director.connect(first.ws)
        ready = await again.open(session_id)
        assert ready["lines"] == SCRIPT and ready["takes"] == []
        await again.close()
        return session_id

    session_id = run(build())
    first.stop()
    second = make_server(data_dir=tmp_path)

    async def resume() -> None:
        director = await Director.connect(second.ws)
        ready = await director.open(session_id)
        assert ready["lines"] == SCRIPT
        # An old client's take of a line the script does not have still adds it, last.
        take = await director.take("new", "A late line.", **SHORT)
        assert take.done["finish_reason"] in ("stop", "length")
        await director.close()
        director = await Director.connect(second.ws)
        assert ids(await director.open(session_id)) == ["a", "draft", "b", "new"]
        await director.close()

    run(resume())


async def kept(director: Director, line_id: str, text: str) -> TakeResult:
    take = await director.take(line_id, text, **SHORT)
    assert take.done["frames"] > 0  # type: ignore[operator]
    await director.request({"type": "take.keep", "take_id": take.take_id}, "history")
    return take


def heard(take: TakeResult) -> list[int]:
    return list(take.of_type("history")[0]["take_ids"])  # type: ignore[call-overload]


def test_the_kept_history_follows_the_script_order(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        session_id = str((await director.open())["session_id"])
        for line_id, text in (("a", "One."), ("b", "Two."), ("c", "Three.")):
            await line(director, {"type": "line.set", "line_id": line_id, "text": text})
        a, b = (await kept(director, "a", "One.")).take_id, (await kept(director, "b", "Two.")).take_id
        # A take of a line hears the kept takes of the lines above it, oldest line first.
        assert heard(await director.take("c", "Three.", **SHORT)) == [a, b]
        assert heard(await director.take("a", "One.", **SHORT)) == []  # not its own kept take, nor later lines'
        script = await line(director, {"type": "line.order", "line_ids": ["b", "c", "a"]})
        assert script["history"] == [b, a]
        assert heard(await director.take("c", "Three.", **SHORT)) == [b]
        assert heard(await director.take("a", "One.", **SHORT)) == [b]  # a's own kept take: never
        script = await line(director, {"type": "line.set", "line_id": "a", "text": "One.", "after": None})
        assert ids(script) == ["a", "b", "c"] and script["history"] == [a, b]
        # A deleted line's kept take leaves the history; its takes stay listed and exportable.
        script = await line(director, {"type": "line.delete", "line_id": "a"})
        assert ids(script) == ["b", "c"] and script["history"] == [b]
        assert heard(await director.take("c", "Three.", **SHORT)) == [b]
        await director.close()
        director = await Director.connect(server.ws)
        ready = await director.open(session_id)
        assert ids(ready) == ["b", "c"] and ready["history"] == [b]
        assert a in [t["take_id"] for t in ready["takes"]]  # type: ignore[union-attr]
        # Setting the line again brings it back with its takes (and its kept take into the history).
        script = await line(director, {"type": "line.set", "line_id": "a", "text": "One.", "after": "c"})
        assert ids(script) == ["b", "c", "a"] and script["history"] == [b, a]
        await director.close()

    run(main())


def test_a_line_has_one_kept_take_and_the_server_says_what_each_line_hears(server: LiveServer) -> None:
    """Keeping a take un-keeps its line's kept take (announced in `unkept`); `hears` counts, per line, the
    first kept takes of the script's history that a new take of the line hears, and follows the script."""
    async def keep(director: Director, take_id: int) -> dict[str, Any]:
        return await director.request({"type": "take.keep", "take_id": take_id}, "history")

    async def main() -> None:
        director = await Director.connect(server.ws)
        session_id = str((await director.open())["session_id"])
        for line_id, text in (("a", "One."), ("b", "Two."), ("c", "Three.")):
            await line(director, {"type": "line.set", "line_id": line_id, "text": text})
        a1, a2 = [(await director.take("a", "One.", **SHORT)).take_id for _ in range(2)]
        b1 = (await director.take("b", "Two.", **SHORT)).take_id
        reply = await keep(director, a1)
        assert (reply["take_ids"], reply["unkept"], reply["hears"]) == ([a1], [], {"a": 0, "b": 1, "c": 1})
        reply = await keep(director, b1)
        assert (reply["take_ids"], reply["unkept"], reply["hears"]) == ([a1, b1], [], {"a": 0, "b": 1, "c": 2})
        reply = await keep(director, a2)  # a's other take: it replaces a1
        assert (reply["take_ids"], reply["unkept"], reply["hears"]) == ([a2, b1], [a1], {"a": 0, "b": 1, "c": 2})
        assert (await keep(director, a2))["unkept"] == []  # kept already: nothing changes
        # A take of c hears what the server said c hears.
        assert heard(await director.take("c", "Three.", **SHORT)) == reply["take_ids"][: reply["hears"]["c"]]
        script = await line(director, {"type": "line.order", "line_ids": ["c", "b", "a"]})
        assert (script["history"], script["hears"]) == ([b1, a2], {"c": 0, "b": 0, "a": 1})
        dropped = await director.request({"type": "take.drop", "take_id": b1}, "history")
        assert (dropped["take_ids"], dropped["unkept"], dropped["hears"]) == ([a2], [], {"c": 0, "b": 0, "a": 0})
        await director.close()
        director = await Director.connect(server.ws)  # another client sees the same scene
        ready = await director.open(session_id)
        assert {t["take_id"]: t["kept"] for t in ready["takes"]} == {  # type: ignore[union-attr]
            a1: False, a2: True, b1: False, a2 + 2: False}
        assert (ready["history"], ready["hears"]) == ([a2], {"c": 0, "b": 0, "a": 0})
        await director.close()

    run(main())


def test_take_messages_carry_the_audio_url(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        session_id = (await director.open())["session_id"]
        take = await director.take("a", "Hello.", **SHORT)
        url = f"/sessions/{session_id}/takes/{take.take_id}.wav"
        assert take.of_type("take.queued")[0]["audio_url"] == url and take.done["audio_url"] == url
        await director.close()

    run(main())


def test_line_messages_that_do_not_fit_the_script(make_server: Any) -> None:
    server = make_server(limits={"max_lines_per_session": 2})

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        await line(director, {"type": "line.set", "line_id": "a", "text": "One."})

        async def refused(message: dict[str, Any]) -> tuple[Any, Any]:
            error = await director.request({**message, "ref": "bad"}, "error")
            assert error["ref"] == "bad"
            return error["code"], error["message"]

        assert await refused({"type": "line.delete", "line_id": "zz"}) == (
            "unknown_line", "'zz' is not a line of the script")
        assert await refused({"type": "line.set", "line_id": "b", "text": "", "after": "zz"}) == (
            "unknown_line", "after: 'zz' is not a line of the script")
        assert await refused({"type": "line.order", "line_ids": ["a", "zz"]}) == (
            "unknown_line", "line_ids: 'zz' is not a line of the script")
        await line(director, {"type": "line.set", "line_id": "b", "text": "Two."})
        assert await refused({"type": "line.order", "line_ids": ["b"]}) == (
            "bad_field", "line_ids must list every line of the script once; missing 'a'")
        limit = "the script holds 2 lines, the most it may; delete a line first"
        assert await refused({"type": "line.set", "line_id": "c", "text": "Three."}) == ("too_many_lines", limit)
        assert await refused({"type": "take.start", "line_id": "c", "text": "Three."}) == ("too_many_lines", limit)
        # Nothing refused changed the script; a line in it can still be edited and taken.
        script = await line(director, {"type": "line.set", "line_id": "a", "text": "One, again."})
        assert [(x["line_id"], x["text"]) for x in script["lines"]] == [("a", "One, again."), ("b", "Two.")]
        assert (await director.take("b", "Two.", **SHORT)).done["finish_reason"] in ("stop", "length")
        await director.close()

    run(main())

"""Scenes on a real server (`/sessions`): new, list, rename, duplicate (everything a director made
is copied, the audio included), delete (a held scene's page is told, a deleted scene does not
open) and restore; each with the scene's key, and nothing with its id alone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
from live_server import LiveServer, run
from test_takes import export

from backend.tools.client import Director

SHORT = {"sampling": {"max_new_tokens": 10, "seed": 8}}


def call(server: LiveServer, method: str, path: str, body: object = None,
         key: str | None = None) -> tuple[int, dict[str, Any]]:
    """A request to the scene routes, with the key of the scene in its path (the one this process
    was given), or `key`."""
    data = None if body is None else json.dumps(body).encode()
    scene = path.split("/")[2] if path.count("/") >= 2 and path.split("/")[2] != "list" else None
    key = key if key is not None else Director.keys.get(scene or "")
    headers = {"Content-Type": "application/json", **({"Retake-Session-Key": key} if key is not None else {})}
    request = urllib.request.Request(f"{server.http}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
            if isinstance(answer.get("session_key"), str):  # a scene made here: its key, once
                Director.keys[answer["session_id"]] = answer["session_key"]
            return response.status, answer
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def listed(server: LiveServer, *ids: str) -> dict[str, Any]:
    wanted = [{"session_id": i, "session_key": Director.keys.get(i, "")} for i in ids]
    status, answer = call(server, "POST", "/sessions/list", {"sessions": wanted})
    assert status == 200
    return answer


def test_a_scene_is_made_listed_renamed_and_duplicated_whole(server: LiveServer) -> None:
    status, made = call(server, "POST", "/sessions", {"name": "Storm, scene 2"})
    assert status == 201 and made["name"] == "Storm, scene 2" and made["session_key"]
    assert (made["lines"], made["takes"], made["seconds"]) == (0, 0, 0)
    scene_id = made["session_id"]

    async def direct() -> tuple[int, int]:
        director = await Director.connect(server.ws)
        ready = await director.open(scene_id)
        assert ready["name"] == "Storm, scene 2" and ready["resumed"] is True
        await director.request({"type": "cast.set", "character_id": "mara", "name": "Mara",
                                "voice": {"description": "a tired keeper"}}, "cast")
        first = await director.take("l1", "Who goes there?", **SHORT)
        await director.request({"type": "take.keep", "take_id": first.take_id}, "history")
        second = await director.take("l2", "A friend.", **SHORT)
        await director.request({"type": "take.note", "take_id": second.take_id, "note": "Good.", "rating": 5},
                               "take.noted")
        await director.close()
        return first.take_id, second.take_id

    first, second = run(direct())
    scene = listed(server, scene_id)["sessions"][0]
    assert (scene["lines"], scene["takes"], scene["kept"]) == (2, 2, 1)
    assert scene["seconds"] == round(10 * 2048 / 44100, 2)  # the kept take's length
    assert scene["updated_ms"] >= made["updated_ms"]

    status, renamed = call(server, "PATCH", f"/sessions/{scene_id}", {"name": "Storm, scene 3"})
    assert status == 200 and renamed["name"] == "Storm, scene 3"
    status, copy = call(server, "POST", f"/sessions/{scene_id}/duplicate")
    assert status == 201 and copy["name"] == "Storm, scene 3 (copy)"
    assert (copy["lines"], copy["takes"], copy["kept"], copy["seconds"]) == (2, 2, 1, scene["seconds"])
    assert [s["session_id"] for s in listed(server, scene_id, copy["session_id"], "nothing")["sessions"]] \
        == [copy["session_id"], scene_id]  # the last changed first
    assert listed(server, "nothing")["unknown"] == ["nothing"]

    async def open_copy() -> dict[str, Any]:
        director = await Director.connect(server.ws)
        ready = await director.open(copy["session_id"])
        await director.close()
        return ready

    ready = run(open_copy())
    assert [m["name"] for m in ready["cast"]] == ["Mara"] and [line["text"] for line in ready["lines"]] == [
        "Who goes there?", "A friend."]
    takes = {t["text"]: t for t in ready["takes"]}
    copied_first, copied_second = takes["Who goes there?"], takes["A friend."]
    assert {copied_first["take_id"], copied_second["take_id"]}.isdisjoint({first, second})
    assert copied_first["kept"] and ready["history"] == [copied_first["take_id"]]
    assert copied_second["history"] == [copied_first["take_id"]]  # the copy's history names the copy
    assert (copied_second["note"], copied_second["rating"], copied_second["character_id"]) == ("Good.", 5, "mara")
    np.testing.assert_array_equal(export(server, copy["session_id"], copied_second["take_id"]),
                                  export(server, scene_id, second))


def test_a_deleted_scene_leaves_the_list_does_not_open_and_comes_back(server: LiveServer) -> None:
    async def main() -> None:
        director = await Director.connect(server.ws)
        ready = await director.open()
        scene_id = str(ready["session_id"])
        await director.request({"type": "line.set", "line_id": "l1", "text": "Still here?"}, "script")
        status, deleted = await asyncio_call(server, "DELETE", f"/sessions/{scene_id}")
        assert status == 200 and deleted["deleted_ms"] is not None
        error = await director.expect("error")  # the page holding it is told, then closed
        assert (error["code"], error["message"]) == ("scene_deleted", (
            "this scene was deleted; restore it (the studio's Undo, or POST /sessions/{id}/restore) to open it"))
        await director.socket.wait_closed()
        assert director.socket.close_code == 1000
        assert listed(server, scene_id)["sessions"] == []
        again = await Director.connect(server.ws)
        refused = await again.request({"type": "session.open", "session_id": scene_id,
                                       "session_key": Director.keys[scene_id]}, "error")
        assert refused["code"] == "scene_deleted"
        status, restored = await asyncio_call(server, "POST", f"/sessions/{scene_id}/restore")
        assert status == 200 and restored["deleted_ms"] is None and restored["lines"] == 1
        back = await again.open(scene_id)
        assert [line["text"] for line in back["lines"]] == ["Still here?"]
        await again.close()

    run(main())


async def asyncio_call(server: LiveServer, method: str, path: str, body: object = None) -> tuple[int, dict[str, Any]]:
    import asyncio

    return await asyncio.to_thread(call, server, method, path, body)


@pytest.mark.parametrize(("method", "path", "body", "status", "says"), [
    ("PATCH", "/sessions/nope", {"name": "x"}, 404, "no scene 'nope' with this key"),
    ("DELETE", "/sessions/nope", None, 404, "no scene 'nope' with this key"),
    ("POST", "/sessions/nope/duplicate", None, 404, "no scene 'nope' with this key"),
    ("POST", "/sessions", {"name": "x" * 200}, 400, "name must be a single line of at most 128 characters"),
    ("POST", "/sessions", [1], 400, "the body must be a JSON object"),
    ("POST", "/sessions/list", {"sessions": "all"}, 400,
     'sessions must be a list of at most 1000 {"session_id", "session_key"} objects'),
])
def test_bad_scene_requests_say_what_to_change(server: LiveServer, method: str, path: str, body: object, status: int,
                                               says: str) -> None:
    assert call(server, method, path, body, key="wrong") == (status, {"error": says})


def test_a_scene_id_alone_reaches_nothing(server: LiveServer) -> None:
    """The id is in export URLs and access logs: without the key it lists, renames, deletes,
    restores and copies nothing (a copy would be a new scene its maker could open)."""
    status, made = call(server, "POST", "/sessions", {"name": "Private"})
    scene_id, key = made["session_id"], made["session_key"]
    for method, path, body in (("PATCH", f"/sessions/{scene_id}", {"name": "Mine"}),
                               ("DELETE", f"/sessions/{scene_id}", None),
                               ("POST", f"/sessions/{scene_id}/restore", None),
                               ("POST", f"/sessions/{scene_id}/duplicate", None)):
        assert call(server, method, path, body, key="")[0] == 404, path
        assert call(server, method, path, body, key=key[:-1] + ("A" if key[-1] != "A" else "B"))[0] == 404, path
        status, answer = call_without_key(server, method, path, body)
        assert status == 401 and "Retake-Session-Key" in answer["error"], path
    status, answer = call(server, "POST", "/sessions/list", {"sessions": [{"session_id": scene_id,
                                                                           "session_key": "guess"}]})
    assert status == 200 and answer == {"sessions": [], "unknown": [scene_id]}
    assert [s["name"] for s in listed(server, scene_id)["sessions"]] == ["Private"]  # with its key
    assert listed(server, scene_id)["sessions"][0]["session_key"] is None  # a key is given once


def call_without_key(server: LiveServer, method: str, path: str, body: object) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())

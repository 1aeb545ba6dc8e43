"""A session is opened with its key, never with its id alone: the id is in every export URL (and
so in access logs and shared links), the key only in session.ready, the client's storage and a
header. On a real server, with real sockets and the real database file."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from live_server import LiveServer, run
from raw_http import request

from backend.tools.client import Director

V0_DATABASE = Path(__file__).parents[1] / "fixtures" / "store" / "retake-v0.sqlite3"
SHORT = {"sampling": {"max_new_tokens": 4, "seed": 3}}


def test_the_id_alone_opens_nothing(server: LiveServer) -> None:
    async def main() -> None:
        owner = await Director.connect(server.ws)
        ready = await owner.open()
        session_id, key = str(ready["session_id"]), ready["session_key"]
        assert isinstance(key, str) and len(key) >= 40 and key != session_id
        take = await owner.take("a", "Places.", **SHORT)

        # Someone who read the id in a log or an export URL: no key, a wrong key, someone else's key.
        thief = await Director.connect(server.ws)
        other = await (await Director.connect(server.ws)).open()
        for given in ("", "guess", str(other["session_key"]), key[:-1] + ("A" if key[-1] != "A" else "B")):
            message = {"type": "session.open", "session_id": session_id, "ref": "x"}
            if given:
                message["session_key"] = given
            error = await thief.request(message, "error")
            assert error["code"] == "unknown_session", error
            assert "with this session_key" in str(error["message"])
        # An id that does not exist reads the same (no way to tell which ids exist).
        error = await thief.request({"type": "session.open", "session_id": "0" * 32, "session_key": key}, "error")
        assert error["code"] == "unknown_session"
        # The owner was not kicked off, and still directs.
        pong = await owner.request({"type": "ping", "t": 2}, "pong")
        assert pong["t"] == 2 and not [m for m in owner.pending if isinstance(m, dict) and m["type"] == "error"]

        # The key opens it (taking it over), and is not sent again.
        again = await thief.open(session_id, key)
        assert again["resumed"] is True and again["session_key"] is None
        assert [t["take_id"] for t in again["takes"]] == [take.take_id]  # type: ignore[index, union-attr]
        assert (await owner.expect("error"))["code"] == "session_taken_over"
        await thief.close()

        # The export: the URL is not enough; the key goes in a header.
        url = f"/sessions/{session_id}/takes/{take.take_id}.wav"
        status, _, reply = request(server.http, "GET", url)
        assert status == 401 and b"Retake-Session-Key" in reply
        assert request(server.http, "GET", url, {"Retake-Session-Key": str(other["session_key"])})[0] == 404
        assert request(server.http, "GET", f"{url}?key={key}")[0] == 401  # a key in the URL is not read
        status, headers, wav = request(server.http, "GET", url, {"Retake-Session-Key": key})
        assert status == 200 and headers["content-type"] == "audio/wav" and wav.startswith(b"RIFF")

    run(main())


def test_the_store_keeps_only_a_hash_of_the_key(make_server: Any, tmp_path: Path) -> None:
    server = make_server(data_dir=tmp_path)

    async def main() -> tuple[str, str]:
        director = await Director.connect(server.ws)
        ready = await director.open()
        await director.close()
        return str(ready["session_id"]), str(ready["session_key"])

    session_id, key = run(main())
    dump = "\n".join(sqlite3.connect(tmp_path / "retake.sqlite3").iterdump())
    assert session_id in dump and key not in dump


def test_a_session_stored_before_keys_is_claimed_by_its_first_resume(make_server: Any, tmp_path: Path) -> None:
    """A data directory from an older Retake: its sessions have no key. The first socket that
    resumes one gets its key (and keeps its takes); from then on the id alone opens nothing."""
    shutil.copy(V0_DATABASE, tmp_path / "retake.sqlite3")
    server: LiveServer = make_server(data_dir=tmp_path)
    session_id = "90a525dc0dbc2e4511296ce3c8ca66f4"

    async def main() -> None:
        first = await Director.connect(server.ws)
        ready = await first.open(session_id, key="")
        key = ready["session_key"]
        assert isinstance(key, str) and ready["resumed"] and len(ready["takes"]) == 4  # type: ignore[arg-type]
        late = await Director.connect(server.ws)
        error = await late.request({"type": "session.open", "session_id": session_id}, "error")
        assert error["code"] == "unknown_session"
        again = await late.open(session_id, key)
        assert again["resumed"] and again["session_key"] is None
        await first.close()
        await late.close()

    run(main())

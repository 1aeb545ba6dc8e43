"""A whole scene exported by the server (`/sessions/{id}/scene.wav`, stems, `scene.srt`) against the
takes as they streamed on the socket: the kept takes in script order with the gap between them,
each character's stem on the same timeline (the stems add up to the scene), and subtitles whose
times are where each take lies in the scene."""

from __future__ import annotations

import io
import urllib.error
import urllib.request
import wave

import numpy as np
from live_server import LiveServer, run

from backend.tools.client import Director

SHORT = {"sampling": {"max_new_tokens": 12, "seed": 4}, "length_guard": False}


def get(server: LiveServer, path: str, key: str | None = None) -> tuple[int, bytes]:
    """GET with the key of the scene in the path (the one this process was given), or `key`."""
    scene = path.split("/")[2]
    headers = {"Retake-Session-Key": key if key is not None else Director.keys.get(scene, "")}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{server.http}{path}", headers=headers),
                                    timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def samples(body: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(body), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def test_a_scene_its_stems_and_subtitles(server: LiveServer) -> None:
    async def direct() -> tuple[str, list[np.ndarray]]:
        director = await Director.connect(server.ws)
        ready = await director.open()
        for character_id, name in (("mara", "Mara"), ("bo", "Bo")):
            await director.request({"type": "cast.set", "character_id": character_id, "name": name,
                                    "voice": {"description": f"{name}, a sailor"}}, "cast")
        kept = []
        for line_id, text, character in (("l1", "Who goes there?", "mara"), ("l2", "A friend.", "bo"),
                                          ("l3", "Then come in.", "mara")):
            await director.request({"type": "line.set", "line_id": line_id, "text": text,
                                    "character_id": character}, "script")
            take = await director.take(line_id, text, **SHORT)
            await director.request({"type": "take.keep", "take_id": take.take_id}, "history")
            kept.append(take.pcm)
        await director.take("l2", "A friend.", **{**SHORT, "sampling": {"max_new_tokens": 5, "seed": 9}})  # not kept
        await director.close()
        return str(ready["session_id"]), kept

    session_id, kept = run(direct())
    assert all(pcm.size > 0 for pcm in kept)
    status, body = get(server, f"/sessions/{session_id}/scene.wav?gap_ms=100")
    assert status == 200
    rate, scene = samples(body)
    gap = np.zeros(round(0.1 * rate), dtype=np.int16)
    np.testing.assert_array_equal(scene, np.concatenate([kept[0], gap, kept[1], gap, kept[2]]))

    starts = [0, kept[0].size + gap.size, kept[0].size + kept[1].size + 2 * gap.size]
    stems = {}
    for character in ("mara", "bo"):
        status, body = get(server, f"/sessions/{session_id}/scene.wav?gap_ms=100&character={character}")
        assert status == 200
        stems[character] = samples(body)[1]
    assert stems["mara"].shape == stems["bo"].shape == scene.shape
    np.testing.assert_array_equal(stems["mara"] + stems["bo"], scene)  # silence where the other speaks
    np.testing.assert_array_equal(stems["bo"][starts[1]:starts[1] + kept[1].size], kept[1])
    assert not np.any(stems["bo"][:starts[1]]) and not np.any(stems["bo"][starts[1] + kept[1].size:])

    status, body = get(server, f"/sessions/{session_id}/scene.srt?gap_ms=100")
    assert status == 200

    def at(sample: int) -> str:
        ms = round(sample * 1000 / rate)
        return f"00:00:{ms // 1000:02d},{ms % 1000:03d}"

    said = ["Mara: Who goes there?", "Bo: A friend.", "Mara: Then come in."]
    expected = "\n".join(f"{n + 1}\n{at(starts[n])} --> {at(starts[n] + kept[n].size)}\n{said[n]}\n" for n in range(3))
    assert body.decode() == expected

    # The default gap is the studio's 300 ms.
    assert samples(get(server, f"/sessions/{session_id}/scene.wav")[1])[1].size == scene.size + 2 * round(0.2 * rate)


def test_bad_scene_exports_say_what_to_change(server: LiveServer) -> None:
    async def made() -> str:
        director = await Director.connect(server.ws)
        ready = await director.open()
        await director.close()
        return str(ready["session_id"])

    session_id = run(made())
    status, body = get(server, f"/sessions/{session_id}/scene.wav")
    assert status == 200 and samples(body)[1].size == 0  # nothing kept yet: an empty scene
    for path, code, says in [
        (f"/sessions/{session_id}/scene.wav?gap_ms=-5", 400, "gap_ms must be a whole number of milliseconds from 0"),
        (f"/sessions/{session_id}/scene.wav?gap_ms=99999", 400, "to 10000"),
        (f"/sessions/{session_id}/scene.wav?character=zed", 400, "none: the scene has no cast"),
        (f"/sessions/{session_id}/scene.srt?character=zed", 400, "only for scene.wav"),
        ("/sessions/no-such-scene/scene.srt", 404, "no scene 'no-such-scene'"),
    ]:
        status, body = get(server, path)
        assert status == code and says in body.decode(), (path, status, body)
    # The id alone (it is in export URLs and logs) exports nothing.
    for path in (f"/sessions/{session_id}/scene.wav", f"/sessions/{session_id}/scene.srt"):
        assert get(server, path, key="")[0] == 404
        assert get(server, path, key="not-the-key")[0] == 404

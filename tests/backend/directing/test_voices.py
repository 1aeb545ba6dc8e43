"""Saved voices on a real server: created and deleted with the official `openai` package (and as JSON,
the way the studio saves one), listed, used by name or id in the speech API and in a directing
session, kept across a restart, and refused with what to change."""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import soundfile as sf
from live_server import LiveServer, run

from backend.tools.client import Director

TAKE = {"max_new_tokens": 12, "seed": 3, "temperature": 0.8}
LINE = "Places, everyone."


def wav(seconds: float = 0.5, hz: float = 220.0) -> bytes:
    t = np.arange(int(44100 * seconds)) / 44100
    buffer = io.BytesIO()
    sf.write(buffer, (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 44100, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def client_of(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def http(server: LiveServer, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"{server.http}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            data = response.read()
            return response.status, json.loads(data) if response.headers["Content-Type"] == "application/json" \
                else data
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def pcm(client: openai.OpenAI, **fields: Any) -> np.ndarray:
    response = client.audio.speech.create(model="tts-1", input=LINE, response_format="pcm", **fields)
    return np.frombuffer(response.content, dtype="<i2")


@pytest.fixture(scope="module")
def voice_server(make_server: Any, tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    from backend.directing.jobs import SilenceGuard

    return make_server(tmp_path_factory.mktemp("voices"), silence=SilenceGuard(retries=0))


def test_a_clip_voice_from_openais_client_speaks_like_its_references(voice_server: LiveServer) -> None:
    client = client_of(voice_server)
    clip = wav()
    voice = client.audio.voices.create(name="Ada", audio_sample=("ada.wav", clip, "audio/wav"), consent="cons_1234",
                                       extra_body={"transcript": "A low hum."})
    assert (voice.object, voice.name, voice.type, voice.prompt) == ("audio.voice", "Ada", "audio_sample", None)
    assert voice.id.startswith("voice_")

    status, listing = http(voice_server, "GET", "/v1/audio/voices")
    assert status == 200 and listing["object"] == "list"
    assert [(v["id"], v["name"], v["references"], v["character"]) for v in listing["data"]] == [
        (voice.id, "Ada", [{"text": "A low hum."}], None)]

    # The saved voice is its clips: the same take as the seed's body with those references.
    by_references = pcm(client, voice="default", extra_body={
        **TAKE, "references": [{"data": base64.b64encode(clip).decode(), "text": "A low hum."}]})
    assert len(by_references) > 0
    np.testing.assert_array_equal(pcm(client, voice="Ada", extra_body=TAKE), by_references)
    np.testing.assert_array_equal(pcm(client, voice={"id": voice.id}, extra_body=TAKE), by_references)
    assert not np.array_equal(pcm(client, voice="default", extra_body=TAKE), by_references)

    with pytest.raises(openai.BadRequestError, match="voice 'Ada' is clips"):
        pcm(client, voice="Ada", instructions="Whisper.", extra_body=TAKE)

    deleted = client.audio.voices.delete(voice.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (voice.id, True, "audio.voice.deleted")
    with pytest.raises(openai.BadRequestError, match="unknown voice 'Ada'; the voices are default"):
        pcm(client, voice="Ada", extra_body=TAKE)
    with pytest.raises(openai.NotFoundError, match="no voice"):
        client.audio.voices.delete(voice.id)


def test_a_prompt_voice_is_a_described_character(voice_server: LiveServer) -> None:
    client = client_of(voice_server)
    voice = client.audio.voices.create(name="Mara", prompt="a tired lighthouse keeper", type="prompt")
    assert (voice.type, voice.prompt) == ("prompt", "a tired lighthouse keeper")

    def envelope(scene: str | None) -> str:
        character = {"name": "Mara", "description": "a tired lighthouse keeper", "scene": scene}
        return "@@drama3-space@@" + json.dumps({"text": LINE, "character": character})

    def envelope_pcm(scene: str | None) -> np.ndarray:
        response = client.audio.speech.create(model="tts-1", voice="default", input=envelope(scene),
                                              response_format="pcm", extra_body=TAKE)
        return np.frombuffer(response.content, dtype="<i2")

    np.testing.assert_array_equal(pcm(client, voice="Mara", extra_body=TAKE), envelope_pcm(None))
    # instructions with a described voice: its scene.
    np.testing.assert_array_equal(pcm(client, voice="Mara", instructions="A storm at night.", extra_body=TAKE),
                                  envelope_pcm("A storm at night."))
    client.audio.voices.delete("Mara")  # by name too


def test_json_voices_as_the_studio_saves_them_and_in_a_directing_session(voice_server: LiveServer) -> None:
    status, ann = http(voice_server, "POST", "/v1/audio/voices", {
        "name": "Ann", "references": [{"audio": base64.b64encode(wav(hz=330)).decode(), "text": "Hello there."}]})
    assert status == 200 and ann["type"] == "audio_sample" and ann["references"] == [{"text": "Hello there."}]
    status, ben = http(voice_server, "POST", "/v1/audio/voices", {
        "name": "Ben", "character": {"name": "Ben", "description": "a cheerful baker", "scene": "Dawn."}})
    assert status == 200 and ben["character"] == {"name": "Ben", "description": "a cheerful baker", "scene": "Dawn."}

    async def main() -> None:
        director = await Director.connect(voice_server.ws)
        await director.request({"type": "session.open"}, "session.ready")
        ready = await director.request({"type": "voice.set", "saved_voice": "Ann", "ref": "v1"}, "voice.ready")
        assert ready["ref"] == "v1" and [r["text"] for r in ready["voice"]["references"]] == ["Hello there."]
        ready = await director.request({"type": "voice.set", "saved_voice": ben["id"]}, "voice.ready")
        assert ready["voice"]["character"] == {"name": "Ben", "description": "a cheerful baker", "scene": "Dawn."}
        error = await director.request({"type": "voice.set", "saved_voice": "Zed", "ref": "v2"}, "error")
        assert (error["code"], error["ref"]) == ("bad_field", "v2")
        assert error["message"] == "saved_voice: unknown voice 'Zed'; the saved voices are Ann, Ben"
        await director.close()

    run(main())
    for voice in (ann, ben):
        assert http(voice_server, "DELETE", f"/v1/audio/voices/{voice['id']}")[0] == 200


def test_saved_voices_outlive_a_restart(make_server: Any, tmp_path: Path) -> None:
    first = make_server(tmp_path)
    status, saved = http(first, "POST", "/v1/audio/voices", {"name": "Kept", "type": "prompt", "prompt": "calm"})
    assert status == 200
    first.stop()
    again = make_server(tmp_path)
    assert [v["id"] for v in http(again, "GET", "/v1/audio/voices")[1]["data"]] == [saved["id"]]


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"name": "Dup", "type": "prompt", "prompt": "x"}, 409, "a voice named 'Dup' exists"),
    ({"name": "default", "type": "prompt", "prompt": "x"}, 400, "'default' is the engine's voice"),
    ({"name": "", "type": "prompt", "prompt": "x"}, 400, "name must be a non-empty string"),
    ({"name": "Two", "type": "prompt", "prompt": "x",
      "references": [{"audio": base64.b64encode(wav()).decode(), "text": "t"}]}, 400, "give one of them"),
    ({"name": "None"}, 400, "give one of them"),
    ({"name": "Mute", "references": [{"audio": base64.b64encode(wav()).decode()}]}, 400, "transcript.0"),
    ({"name": "Noise", "references": [{"audio": base64.b64encode(b"not audio").decode(), "text": "t"}]}, 400,
     "clip 0 is not a WAV or FLAC file"),
    ({"name": "Colon", "character": {"name": "A: B", "description": "x"}}, 400, "must not contain ':'"),
])
def test_bad_voices_are_refused_with_what_to_change(voice_server: LiveServer, body: dict[str, Any], status: int,
                                                     says: str) -> None:
    if status == 409:
        assert http(voice_server, "POST", "/v1/audio/voices", body)[0] == 200
    code, reply = http(voice_server, "POST", "/v1/audio/voices", body)
    assert code == status and says in reply["error"]["message"], reply
    if status == 409:
        http(voice_server, "DELETE", "/v1/audio/voices/Dup")


def test_openais_client_without_a_transcript_is_told_how_to_add_one(voice_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError, match="extra_body"):
        client_of(voice_server).audio.voices.create(name="Cue", audio_sample=("cue.wav", wav(), "audio/wav"),
                                                    consent="cons_1")


def test_the_store_keeps_saved_voices_on_either_database(database: Path | str) -> None:
    """SQLite and PostgreSQL: the clips' bytes come back as saved, names are unique, deletes are whole."""
    from backend.directing.protocol import CharacterSpec
    from backend.store import Store

    store = Store(database)
    clip = wav()
    ada = store.save_voice("Ada", [(clip, "A low hum."), (b"fLaC...", "Two.")], None, "cons_1")
    mara = store.save_voice("Mara", [], CharacterSpec("Mara", "a tired keeper", None), None)
    assert ada is not None and mara is not None
    assert store.save_voice("Ada", [], CharacterSpec("Ada", "again", None), None) is None  # the name is taken
    assert [(v.name, v.transcripts, v.audio, v.character) for v in store.saved_voices()] == [
        ("Ada", ["A low hum.", "Two."], [], None), ("Mara", [], [], CharacterSpec("Mara", "a tired keeper", None))]
    for key in ("Ada", ada.voice_id):
        found = store.saved_voice(key)
        assert found is not None and found.clips == [(clip, "A low hum."), (b"fLaC...", "Two.")]
        assert found.consent == "cons_1"
    deleted = store.delete_saved_voice(ada.voice_id)
    assert deleted is not None and deleted.name == "Ada" and store.saved_voice("Ada") is None
    assert store.delete_saved_voice("Ada") is None and [v.name for v in store.saved_voices()] == ["Mara"]
    store.close()


def test_saved_voices_join_a_cast_as_copies(voice_server: LiveServer) -> None:
    """cast.set with voice.saved_voice: the character speaks exactly as one given the same clips (or
    description) directly, under its cast name; deleting the saved voice leaves the cast as it is."""
    clip = base64.b64encode(wav(hz=440)).decode()
    status, cleo = http(voice_server, "POST", "/v1/audio/voices", {
        "name": "Cleo", "references": [{"audio": clip, "text": "Good evening."}]})
    assert status == 200
    status, dan = http(voice_server, "POST", "/v1/audio/voices", {
        "name": "Dan", "character": {"name": "Dan", "description": "a gruff ferryman", "scene": "Fog."}})
    assert status == 200
    take = {"sampling": {"max_new_tokens": 8, "seed": 3}, "length_guard": False}

    async def main() -> None:
        director = await Director.connect(voice_server.ws)
        await director.open()
        members = (await director.request({"type": "cast.set", "character_id": "c", "name": "Cleo Vane",
                                           "voice": {"saved_voice": "Cleo"}}, "cast"))["characters"]
        assert [r["text"] for r in members[0]["voice"]["references"]] == ["Good evening."]
        members = (await director.request({"type": "cast.set", "character_id": "d", "name": "Old Dan",
                                           "voice": {"saved_voice": dan["id"]}}, "cast"))["characters"]
        assert members[1]["voice"]["character"] == {"name": "Old Dan", "description": "a gruff ferryman",
                                                    "scene": "Fog."}
        await director.request({"type": "line.set", "line_id": "l1", "text": "Who's there?"}, "script")
        saved = await director.take("l1", "Who's there?", **take)
        # The same clip given directly: the same take, sample for sample.
        await director.request({"type": "cast.set", "character_id": "c", "name": "Cleo Vane",
                                "voice": {"references": [{"audio": clip, "text": "Good evening."}]}}, "cast")
        direct = await director.take("l1", "Who's there?", **take)
        np.testing.assert_array_equal(saved.pcm, direct.pcm)
        assert saved.pcm.size > 0

        for voice, says in [({"saved_voice": "Zed"}, "voice.saved_voice: unknown voice 'Zed'; the saved voices "
                                                     "are Cleo, Dan"),
                            ({"saved_voice": "Cleo", "description": "x"}, "give a saved_voice alone")]:
            error = await director.request({"type": "cast.set", "character_id": "z", "name": "Zed",
                                            "voice": voice}, "error")
            assert error["code"] == "bad_field" and says in error["message"], error
        for voice in (cleo, dan):
            assert http(voice_server, "DELETE", f"/v1/audio/voices/{voice['id']}")[0] == 200
        members = (await director.request({"type": "cast.set", "character_id": "d", "name": "Dan"}, "cast"))[
            "characters"]
        assert members[1]["voice"]["character"]["description"] == "a gruff ferryman"
        await director.close()

    run(main())

"""backend/directing/protocol/ and parse.py (and the audio frame of backend/transport.py) against the
shared fixtures that frontend/src/studio/protocol.ts is tested on too."""

from __future__ import annotations

import base64
import dataclasses
import json
import typing
from pathlib import Path

import pytest

from backend.directing import protocol as p
from backend.directing.parse import parse_client_message
from backend.transport import pack_audio_frame, unpack_audio_frame
from engine import Sampling

FIXTURES = Path(__file__).parents[2] / "fixtures" / "protocol"
LIMITS = p.Limits()


def load(name: str) -> list[dict[str, typing.Any]]:
    return json.loads((FIXTURES / name).read_text())


def wire_name(cls: type) -> str:
    return typing.get_args(typing.get_type_hints(cls)["type"])[0]


def test_every_message_type_has_a_fixture() -> None:
    client_types = {sample["message"]["type"] for sample in load("client_messages.json")}
    server_types = {sample["message"]["type"] for sample in load("server_messages.json")}
    assert client_types == {wire_name(cls) for cls in typing.get_args(p.ClientMessage)}
    assert server_types == {wire_name(cls) for cls in typing.get_args(p.ServerMessage)}


@pytest.mark.parametrize("sample", load("client_messages.json"), ids=lambda s: s["name"])
def test_client_fixture_parses_to_its_fields(sample: dict[str, typing.Any]) -> None:
    raw = sample["message"]
    message = parse_client_message(json.dumps(raw), LIMITS)
    assert message.type == raw["type"]
    assert message.ref == raw.get("ref")
    if isinstance(message, p.TakeStart):
        assert (message.line_id, message.text) == (raw["line_id"], raw["text"])
        assert message.history == ("kept" if "history" not in raw else tuple(raw["history"]))
        # The client's fields over the engine's defaults (a missing seed stays None: the server picks it).
        assert dataclasses.asdict(message.sampling) == {**dataclasses.asdict(Sampling()), **raw.get("sampling", {})}
        assert message.deadline_ms == raw.get("deadline_ms")
        assert message.length_guard == raw.get("length_guard", True)
    elif isinstance(message, p.VoiceSet):
        assert [(base64.b64encode(clip.audio).decode(), clip.text) for clip in message.references] == [
            (clip["audio"], clip["text"]) for clip in raw.get("references", [])
        ]
        character = raw.get("character")
        assert (dataclasses.asdict(message.character) if message.character else None) == (
            None if character is None else {"scene": None, **character})
    elif isinstance(message, p.LineSet):
        assert (message.line_id, message.text) == (raw["line_id"], raw["text"])
        assert (message.place, message.after) == ("after" in raw, raw.get("after"))
        assert (message.cast, message.character_id) == ("character_id" in raw, raw.get("character_id"))
    elif isinstance(message, p.CastSet):
        assert (message.character_id, message.name) == (raw["character_id"], raw["name"])
        voice = raw.get("voice")
        if voice is None:
            assert message.voice is None
        else:
            assert message.voice is not None
            assert [(base64.b64encode(clip.audio).decode(), clip.text) for clip in message.voice.references] == [
                (clip["audio"], clip["text"]) for clip in voice.get("references", [])]
            assert (message.voice.description, message.voice.scene) == (voice.get("description"), voice.get("scene"))
    elif isinstance(message, p.CastDelete):
        assert message.character_id == raw["character_id"]
    elif isinstance(message, p.TakeNote):
        assert (message.take_id, message.note, message.rating) == (raw["take_id"], raw.get("note"), raw.get("rating"))
    elif isinstance(message, p.LineDelete):
        assert message.line_id == raw["line_id"]
    elif isinstance(message, p.LineOrder):
        assert message.line_ids == tuple(raw["line_ids"])
    elif isinstance(message, (p.TakeCancel, p.TakeKeep, p.TakeDrop)):
        assert message.take_id == raw["take_id"]
    elif isinstance(message, p.SessionOpen):
        assert (message.session_id, message.session_key) == (raw.get("session_id"), raw.get("session_key"))
    elif isinstance(message, p.Ping):
        assert message.t == raw.get("t")


@pytest.mark.parametrize("sample", load("server_messages.json"), ids=lambda s: s["name"])
def test_server_fixture_is_what_dump_writes(sample: dict[str, typing.Any]) -> None:
    raw = sample["message"]
    cls = {wire_name(c): c for c in typing.get_args(p.ServerMessage)}[raw["type"]]
    fields = {name: value for name, value in raw.items() if name != "type"}
    # Every field is present on the wire (null when absent): the key sets must match exactly.
    assert set(fields) == {f.name for f in dataclasses.fields(cls)} - {"type"}
    text = p.dump(cls(**fields))
    assert json.loads(text) == raw
    assert next(iter(json.loads(text))) == "type"


def test_the_sampling_wire_form_is_the_engines_fields() -> None:
    assert list(p.SamplingInfo.__annotations__) == [field.name for field in dataclasses.fields(Sampling)]


@pytest.mark.parametrize("sample", load("invalid_client_messages.json"), ids=lambda s: s["name"])
def test_invalid_client_messages_get_their_code(sample: dict[str, typing.Any]) -> None:
    with pytest.raises(p.ProtocolError) as caught:
        parse_client_message(sample["text"], LIMITS)
    assert caught.value.code == sample["code"]
    assert caught.value.message == sample["message"]


def test_ref_is_echoed_on_errors() -> None:
    with pytest.raises(p.ProtocolError) as caught:
        parse_client_message('{"type": "take.keep", "take_id": "x", "ref": "r9"}', LIMITS)
    assert (caught.value.code, caught.value.ref) == ("bad_field", "r9")


def test_message_size_counts_utf8_bytes() -> None:
    limits = dataclasses.replace(LIMITS, max_message_bytes=64)
    text = json.dumps({"type": "ping", "ref": "é" * 20}, ensure_ascii=False)  # 40 characters of 2 bytes
    assert len(text) <= 64 < len(text.encode())
    with pytest.raises(p.ProtocolError) as caught:
        parse_client_message(text, limits)
    assert caught.value.code == "message_too_big"


def test_reference_size_limit() -> None:
    limits = dataclasses.replace(LIMITS, max_reference_bytes=10)
    audio = base64.b64encode(b"x" * 11).decode()
    with pytest.raises(p.ProtocolError) as caught:
        parse_client_message(json.dumps({"type": "voice.set", "references": [{"audio": audio, "text": "a"}]}), limits)
    assert caught.value.code == "bad_field" and "references.0.audio" in caught.value.message


@pytest.mark.parametrize("sample", load("audio_frames.json"), ids=lambda s: s["name"])
def test_audio_frame_fixtures(sample: dict[str, typing.Any]) -> None:
    frame = bytes.fromhex(sample["hex"])
    header, pcm = unpack_audio_frame(frame)
    expected = sample["header"]
    assert len(frame) == 16 + 2 * len(sample["samples"])
    assert (header.kind, header.flags, header.take_id, header.seq, header.start_sample, header.last) == (
        expected["kind"], expected["flags"], expected["take_id"], expected["seq"], expected["start_sample"],
        expected["last"])
    assert frame[2:4] == b"\x00\x00"  # reserved
    assert list(memoryview(pcm).cast("h")) == sample["samples"]
    packed = pack_audio_frame(header.take_id, header.seq, header.start_sample, pcm, last=header.last)
    assert packed == frame


def test_audio_frame_rejects_a_torn_frame() -> None:
    with pytest.raises(ValueError):
        unpack_audio_frame(b"\x01" * 15)
    with pytest.raises(ValueError):
        unpack_audio_frame(pack_audio_frame(1, 0, 0, b"\x00\x00", last=False) + b"\x00")

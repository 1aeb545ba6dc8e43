"""backend/conversation/protocol.py against the shared fixtures (tests/fixtures/protocol/conversation_*.json)
that the TypeScript side of the conversation page is tested on too."""

from __future__ import annotations

import base64
import dataclasses
import json
import typing
from pathlib import Path

import pytest

from backend.conversation import protocol as cp

FIXTURES = Path(__file__).parents[2] / "fixtures" / "protocol"


def load(name: str) -> list[dict[str, typing.Any]]:
    return json.loads((FIXTURES / f"conversation_{name}.json").read_text())


def wire_name(cls: type) -> str:
    return typing.get_args(typing.get_type_hints(cls)["type"])[0]


def test_every_message_type_has_a_fixture() -> None:
    client_types = {sample["message"]["type"] for sample in load("client_messages")}
    server_types = {sample["message"]["type"] for sample in load("server_messages")}
    assert client_types == {wire_name(cls) for cls in typing.get_args(cp.ClientMessage)}
    assert server_types == {wire_name(cls) for cls in typing.get_args(cp.ServerMessage)}


@pytest.mark.parametrize("sample", load("client_messages"), ids=lambda s: s["name"])
def test_client_fixture_parses_to_its_fields(sample: dict[str, typing.Any]) -> None:
    raw = sample["message"]
    message = cp.parse_client_message(json.dumps(raw))
    assert message.type == raw["type"]
    if isinstance(message, cp.ConversationOpen):
        clip = raw.get("voice_clip")
        assert (message.persona, message.voice, message.seed) == (raw.get("persona"), raw.get("voice"),
                                                                  raw.get("seed"))
        assert message.voice_clip == (None if clip is None else base64.b64decode(clip))


@pytest.mark.parametrize("sample", load("server_messages"), ids=lambda s: s["name"])
def test_server_fixture_is_what_dump_writes(sample: dict[str, typing.Any]) -> None:
    raw = sample["message"]
    cls = {wire_name(c): c for c in typing.get_args(cp.ServerMessage)}[raw["type"]]
    fields = {name: value for name, value in raw.items() if name != "type"}
    # Every field is present on the wire: the key sets must match exactly.
    assert set(fields) == {f.name for f in dataclasses.fields(cls)} - {"type"}
    text = cp.dump(cls(**fields))
    assert json.loads(text) == raw
    assert next(iter(json.loads(text))) == "type"


@pytest.mark.parametrize("sample", load("invalid_client_messages"), ids=lambda s: s["name"])
def test_invalid_client_messages_get_their_code(sample: dict[str, typing.Any]) -> None:
    with pytest.raises(cp.ConversationError) as caught:
        cp.parse_client_message(sample["text"])
    assert (caught.value.code, caught.value.message) == (sample["code"], sample["message"])


def test_unknown_fields_are_ignored() -> None:
    message = cp.parse_client_message('{"type": "converse.open", "voice": "NATF2", "volume": 11}')
    assert message == cp.ConversationOpen(voice="NATF2")

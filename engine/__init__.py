"""Retake's engines. The backend imports only these names.

Drama 3 (text to speech, streamed takes): `load_engine(EngineSpec(...))` gives an engine
owned by one thread; `engine.prompt(...)` checks a take and lays it out, and
`engine.generate(prompt)` yields `AudioWindow`s then one `Done`; several takes decode
together through `engine.start(prompt)` (a `Take` in a free slot) and `engine.step()`.
`check_text` and `checked_character` check a caller's text and character early, naming the
field. Every error a user can cause is a `RequestError`. `pcm16` is the one float-to-PCM16
conversion of both engines.

Host-side data crosses this boundary as numpy: codes are int64 arrays [num_codebooks,
frames] (`Reference.codes`, `HistoryTurn.codes`, `Done.codes`, `encode_reference`'s result,
`vocode_take`'s input), PCM is int16 (`AudioWindow.pcm`, `vocode_take`'s result); torch
stays inside the engine. `Sampling` is the one sampling type: its defaults and its check
(`Sampling.from_fields`) serve every caller.

The names that need torch (the engine, prompts, takes) load on first use, so a module that
only needs the light ones (`Sampling`, `RequestError`, `check_text`: the backend's wire
protocol) does not load the model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from engine.drama3.sampling import Sampling
from engine.drama3.text import check_text
from engine.errors import RequestError

if TYPE_CHECKING:
    from engine.drama3.engine import Drama3Engine, EngineSpec, load_engine
    from engine.drama3.prompt import Character, HistoryTurn, Prompt, Reference, checked_character
    from engine.drama3.take import AudioWindow, Done, Take
    from engine.pcm import pcm16

_LAZY = {
    "Drama3Engine": "engine.drama3.engine", "EngineSpec": "engine.drama3.engine", "load_engine": "engine.drama3.engine",
    "Character": "engine.drama3.prompt", "HistoryTurn": "engine.drama3.prompt", "Prompt": "engine.drama3.prompt",
    "Reference": "engine.drama3.prompt", "checked_character": "engine.drama3.prompt",
    "AudioWindow": "engine.drama3.take", "Done": "engine.drama3.take", "Take": "engine.drama3.take",
    "pcm16": "engine.pcm",
}

__all__ = [
    "AudioWindow", "Character", "Done", "Drama3Engine", "EngineSpec", "HistoryTurn", "Prompt", "Reference",
    "RequestError", "Sampling", "Take", "check_text", "checked_character", "load_engine", "pcm16",
]


def __getattr__(name: str) -> object:
    """The torch-backed names, imported on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

"""Retake's engines. The backend imports only these names.

Drama 3 (text to speech, streamed takes): `load_engine(EngineSpec(...))` gives an engine
owned by one thread; `engine.prompt(...)` checks a take and lays it out, and
`engine.generate(prompt)` yields `AudioWindow`s then one `Done`; several takes decode
together through `engine.start(prompt)` (a `Take` in a free slot) and `engine.step()`.
`check_text` and `checked_character` check a caller's text and character early, naming the
field. Every error a user can cause is a `RequestError`. `pcm16` is the one float-to-PCM16
conversion of both engines.
"""

from engine.drama3.engine import Drama3Engine, EngineSpec, load_engine
from engine.drama3.prompt import Character, HistoryTurn, Prompt, Reference, checked_character
from engine.drama3.sampling import Sampling
from engine.drama3.take import AudioWindow, Done, Take
from engine.drama3.text import check_text
from engine.errors import RequestError
from engine.pcm import pcm16

__all__ = [
    "AudioWindow", "Character", "Done", "Drama3Engine", "EngineSpec", "HistoryTurn", "Prompt", "Reference",
    "RequestError", "Sampling", "Take", "check_text", "checked_character", "load_engine", "pcm16",
]

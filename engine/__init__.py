"""Retake's engines. The backend imports only these names.

Drama 3 (text to speech, streamed takes): `load_engine(EngineSpec(...))` gives an engine
owned by one thread; `engine.prompt(...)` checks a take and lays it out, and
`engine.generate(prompt)` yields `AudioWindow`s then one `Done`; several takes decode
together through `engine.start(prompt)` (a `Take` in a free slot) and `engine.step()`.
`parse_speech_request` reads the seed's `/v1/audio/speech` body;
`engine.speech_prompt(request)` turns it into a prompt. Every error a user can cause is a
`RequestError`.
"""

from engine.drama3.engine import Drama3Engine, EngineSpec, load_engine
from engine.drama3.prompt import Character, HistoryTurn, Prompt, Reference
from engine.drama3.request import Clip, SpeechRequest, parse_speech_request
from engine.drama3.sampling import Sampling
from engine.drama3.take import AudioWindow, Done, Take
from engine.errors import RequestError

__all__ = [
    "AudioWindow", "Character", "Clip", "Done", "Drama3Engine", "EngineSpec", "HistoryTurn", "Prompt",
    "Reference", "RequestError", "Sampling", "SpeechRequest", "Take", "load_engine", "parse_speech_request",
]

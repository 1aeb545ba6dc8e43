"""The directing protocol on `/ws`: typed messages, one module per side (client.py: client →
server, server.py: server → client), with the records both carry (info.py) and the error codes
(errors.py); everything is importable from here (`from backend.directing import protocol as p`).

Design choices (docs/protocol.md is the full description; tests/fixtures/protocol/ holds
samples that the TypeScript side, frontend/src/studio/protocol.ts, is tested against too):

- Text frames are JSON objects with a `type`. Each message is a frozen dataclass whose
  `type` is a `Literal`, so a message's wire name appears once and a `match` over the
  union is exhaustive under a type checker.
- Client messages are checked by hand in backend/directing/parse.py (no schema library): each
  check names the field and says what to change, and raises `ProtocolError(code, message)`.
- Server messages always carry every field (null when absent), so the client never
  guesses between "missing" and "null".
- Audio travels as binary frames (backend/transport.py: a 16-byte little-endian header,
  then PCM16 samples). Control never travels in binary frames, and the client never sends
  binary frames.
- The script (lines and their order) is the server's: `line.set`, `line.delete` and
  `line.order` change it, and each is answered with the whole script (`script`), so a client
  converges on what was stored whatever it guessed locally. So is the directing history
  (backend/directing/script.py): which take of a line is kept, and what each line hears.
"""

from __future__ import annotations

from backend.directing.protocol.client import (
    CastDelete,
    CastSet,
    CastVoice,
    CharacterSpec,
    ClientMessage,
    Limits,
    LineDelete,
    LineOrder,
    LineSet,
    Ping,
    ReferenceClip,
    SessionOpen,
    TakeCancel,
    TakeDrop,
    TakeKeep,
    TakeNote,
    TakeStart,
    VoiceSet,
)
from backend.directing.protocol.errors import PROTOCOL_ERRORS, ErrorCode, ProtocolError
from backend.directing.protocol.info import (
    CastInfo,
    CharacterInfo,
    FinishReason,
    LineInfo,
    ReferenceInfo,
    SamplingInfo,
    TakeInfo,
    TakeState,
    VoiceInfo,
)
from backend.directing.protocol.server import (
    PROTOCOL_VERSION,
    Cast,
    Error,
    History,
    Pong,
    Script,
    ServerMessage,
    SessionReady,
    TakeDone,
    TakeNoted,
    TakeQueued,
    TakeRetry,
    TakeStarted,
    VoiceReady,
    dump,
)

__all__ = [
    "PROTOCOL_ERRORS", "PROTOCOL_VERSION", "Cast", "CastDelete", "CastInfo", "CastSet", "CastVoice", "CharacterInfo",
    "CharacterSpec", "ClientMessage", "Error", "ErrorCode", "FinishReason", "History", "Limits", "LineDelete",
    "LineInfo", "LineOrder", "LineSet", "Ping", "Pong", "ProtocolError", "ReferenceClip", "ReferenceInfo",
    "SamplingInfo", "Script", "ServerMessage", "SessionOpen", "SessionReady", "TakeCancel", "TakeDone", "TakeDrop",
    "TakeInfo", "TakeKeep", "TakeNote", "TakeNoted", "TakeQueued", "TakeRetry", "TakeStart", "TakeStarted",
    "TakeState", "VoiceInfo", "VoiceReady", "VoiceSet", "dump",
]

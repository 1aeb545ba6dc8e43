"""The directing protocol's error codes, and the exception a refused client message raises.

Design choices:
- One `Literal` of codes, each with what it means beside it; the codes that say the message
  itself is wrong (`PROTOCOL_ERRORS`) count towards limits.max_protocol_errors, the others
  (well formed, but not doable now) do not.
- Refusals are raised (`ProtocolError`) where they are found, with a message that says what to
  change, and become one `error` message on the socket (server.py: `Error.of`).
"""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal[
    # The message itself is wrong: these count towards the protocol-error limit.
    "bad_json",  # not valid JSON, or not a JSON object
    "unknown_type",  # `type` missing or not a message this server knows
    "bad_field",  # a field is missing, of the wrong type or out of range (the message names it)
    "binary_not_supported",  # the client sent a binary frame
    "message_too_big",  # a frame larger than limits.max_message_bytes
    "session_not_open",  # a message other than session.open before session.open
    # The message is well formed but cannot be done now.
    "session_already_open",  # a second session.open on one socket
    "unknown_session",  # session.open with a session_id the server has never stored
    "scene_deleted",  # session.open of a deleted scene, or the scene held was deleted (then close 1000)
    "session_taken_over",  # another socket resumed this session; this one is closed
    "too_many_sessions",  # limits.max_sessions sockets are open; the socket is closed
    "unknown_take",  # a take_id that is not a take of this session
    "unknown_line",  # a line_id (or `after`) that is not a line of this session's script
    "unknown_character",  # a character_id that is not a member of this session's cast
    "too_many_characters",  # the cast holds limits.max_cast characters
    "too_many_lines",  # the script holds limits.max_lines_per_session lines
    "take_not_finished",  # keep (or use as history) a take that is still queued or running
    "take_not_usable",  # keep (or use as history) a take without audio (0 frames)
    "too_many_takes",  # the session holds limits.max_takes_per_session takes
    "busy",  # the engine queue is full; retry after retry_after_ms
    "draining",  # the replica is draining (SIGTERM): reconnect (close 1012 follows) and start the take there
    "bad_reference",  # the engine refused a reference clip (format, length, transcript)
    "internal",  # a server fault; the socket stays usable
]
PROTOCOL_ERRORS: frozenset[str] = frozenset(
    {"bad_json", "unknown_type", "bad_field", "binary_not_supported", "message_too_big", "session_not_open"}
)


class ProtocolError(Exception):
    """A client message the server refuses; becomes an `error` message on the socket."""

    def __init__(self, code: ErrorCode, message: str, *, take_id: int | None = None, ref: str | None = None,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.take_id = take_id
        self.ref = ref
        self.retry_after_ms = retry_after_ms

"""The `/ws` endpoint: admission, then three tasks per socket under one TaskGroup.

- `receive`: reads frames, parses them (backend/parse.py), answers `session.open`,
  `ping` and `take.cancel` at once, supersedes the running take on `take.start`, and queues
  the other messages for `commands`. Bad input becomes an `error` message; after
  `limits.max_protocol_errors` of them the socket is closed with 1008.
- `commands`: runs voice.set / line.* / take.start / keep / drop in arrival order (voice.set waits for
  the engine to encode its clips; a cancel must not wait behind it, hence two tasks).
- `send`: drains the socket's Outbox, so no other code awaits the network.

A failure in any task cancels the others (TaskGroup); the socket's take is then cancelled and
its session released, whatever the reason (unmute's `_run_route` shape).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping

from starlette import status
from starlette.websockets import WebSocket, WebSocketDisconnect

from backend import protocol as p
from backend.parse import parse_client_message
from backend.session import Close, Session
from backend.settings import Settings
from backend.state import ServerState

log = logging.getLogger("retake.ws")
COMMAND_BACKLOG = 32  # in-order messages waiting; past it the socket stops being read


class Stop(Exception):
    """Ends a socket's tasks: the client left, or the server closed the socket."""


def origin_allowed(headers: Mapping[str, str], scheme: str, settings: Settings) -> bool:
    """Same origin by default; clients without an Origin header (not browsers) are allowed."""
    origin = headers.get("origin")
    if origin is None or "*" in settings.allow_origins or origin in settings.allow_origins:
        return True
    http = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    return origin == f"{http}://{headers.get('host', '')}"


def token_ok(headers: Mapping[str, str], query: Mapping[str, str], settings: Settings) -> bool:
    if settings.token is None:
        return True
    given = query.get("token") or ""
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        given = authorization[7:].strip()
    return secrets.compare_digest(given.encode(), settings.token.encode())


async def directing_socket(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.retake
    settings = state.settings
    if not origin_allowed(websocket.headers, websocket.url.scheme, settings) or not token_ok(
            websocket.headers, websocket.query_params, settings):
        await websocket.close(status.WS_1008_POLICY_VIOLATION)  # before accept: HTTP 403
        return
    await websocket.accept()
    if state.sockets >= settings.limits.max_sessions:
        await websocket.send_text(p.dump(p.Error(
            "too_many_sessions", f"{settings.limits.max_sessions} sessions are open, the most this server takes; "
                                 "try again later")))
        await websocket.close(status.WS_1013_TRY_AGAIN_LATER)
        return
    state.sockets += 1
    session = Session(state)
    commands: asyncio.Queue[p.ClientMessage] = asyncio.Queue(COMMAND_BACKLOG)
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(receive(websocket, session, commands))
            tasks.create_task(run_commands(session, commands))
            tasks.create_task(send(websocket, session))
    except* (Stop, WebSocketDisconnect):
        pass
    except* Exception as group:
        log.error("directing socket failed", exc_info=group)
        try:
            await websocket.close(status.WS_1011_INTERNAL_ERROR)
        except Exception:  # noqa: BLE001 - the socket may already be gone
            pass
    finally:
        state.sockets -= 1
        session.outbox.closed = True
        session.detach()


def report(session: Session, error: p.ProtocolError) -> None:
    """Send an error; close the socket if the client keeps breaking the protocol."""
    session.outbox.message(p.Error.of(error))
    if error.code in p.PROTOCOL_ERRORS:
        session.protocol_errors += 1
        if session.protocol_errors >= session.limits.max_protocol_errors:
            session.outbox.close(status.WS_1008_POLICY_VIOLATION, "too many protocol errors")


async def receive(websocket: WebSocket, session: Session, commands: asyncio.Queue[p.ClientMessage]) -> None:
    limits = session.limits
    while True:
        frame = await websocket.receive()
        if frame["type"] == "websocket.disconnect":
            raise Stop
        if session.outbox.closed:
            continue  # closing: ignore what the client still sends
        text, data = frame.get("text"), frame.get("bytes")
        try:
            if text is None:
                size = len(data or b"")
                raise p.ProtocolError("binary_not_supported", f"the server takes JSON text frames only (got "
                                                              f"{size} bytes of binary)")
            message = parse_client_message(text, limits)
        except p.ProtocolError as error:
            report(session, error)
            continue
        try:
            match message:
                case p.SessionOpen():
                    session.open(message)
                case p.Ping():
                    session.outbox.message(p.Pong(message.t, message.ref))
                case p.TakeCancel():
                    session.cancel(message)
                case _:
                    session.require_open()
                    if isinstance(message, p.TakeStart):
                        session.supersede()
                    await commands.put(message)
        except p.ProtocolError as error:
            error.ref = message.ref
            report(session, error)


async def run_commands(session: Session, commands: asyncio.Queue[p.ClientMessage]) -> None:
    while True:
        message = await commands.get()
        try:
            await session.handle(message)
        except p.ProtocolError as error:
            error.ref = message.ref
            report(session, error)
        except Exception as error:  # noqa: BLE001 - one message's fault leaves the socket usable
            log.exception("handling %s failed", message.type)
            session.outbox.message(p.Error("internal", f"the server failed on {message.type}: "
                                                       f"{type(error).__name__}", None, message.ref, None))


async def send(websocket: WebSocket, session: Session) -> None:
    while True:
        item = await session.outbox.get()
        if isinstance(item, Close):
            await websocket.close(item.code, item.reason)
            raise Stop
        if isinstance(item, bytes):
            await websocket.send_bytes(item)
        else:
            await websocket.send_text(item)

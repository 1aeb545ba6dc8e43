"""The `/ws` endpoint: admission (backend/transport.py), then three tasks per socket under one TaskGroup.

Design choices:
- `receive`: reads frames, parses them (backend/directing/parse.py), answers `session.open`,
  `ping` and `take.cancel` at once, supersedes the running take on `take.start`, and queues
  the other messages for `commands`. Bad input becomes an `error` message; after
  `limits.max_protocol_errors` of them the socket is closed with 1008.
- `commands`: runs voice.set / line.* / take.start / keep / drop in arrival order (voice.set waits for
  the engine to encode its clips; a cancel must not wait behind it, hence two tasks).
- `send`: drains the socket's outbox (transport.send_loop), so no other code awaits the network.

- A failure in any task cancels the others (TaskGroup); the socket's take is then cancelled
  and its session released, whatever the reason (unmute's `_run_route` shape).
"""

from __future__ import annotations

import asyncio
import logging

import sqlalchemy as sa
from starlette import status
from starlette.websockets import WebSocket, WebSocketDisconnect

from backend.directing import protocol as p
from backend.directing.live_take import NOT_READING
from backend.directing.parse import parse_client_message
from backend.directing.session import Session
from backend.draining import REASON, RECONNECT
from backend.state import ServerState
from backend.store_thread import problem
from backend.transport import Stop, admit, send_loop

log = logging.getLogger("retake.ws")
COMMAND_BACKLOG = 32  # in-order messages waiting; past it the socket stops being read


async def directing_socket(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.retake
    settings = state.settings
    if not await admit(websocket, settings):
        return
    if state.draining:  # the balancer has not noticed yet: off to another replica
        await websocket.close(RECONNECT, REASON)
        return
    if state.sockets >= settings.limits.max_sessions:
        await websocket.send_text(p.dump(p.Error(
            "too_many_sessions", f"{settings.limits.max_sessions} sessions are open, the most this server takes; "
                                 "try again later")))
        await websocket.close(status.WS_1013_TRY_AGAIN_LATER)
        return
    session = Session(state)
    state.directing.add(session)
    commands: asyncio.Queue[p.ClientMessage] = asyncio.Queue(COMMAND_BACKLOG)
    unopened = asyncio.get_running_loop().call_later(settings.open_timeout_s, close_unopened, session,
                                                     settings.open_timeout_s)
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(receive(websocket, session, commands))
            tasks.create_task(run_commands(session, commands))
            tasks.create_task(send_loop(websocket, session.outbox, settings.send_timeout_s))
    except* (Stop, WebSocketDisconnect):
        pass
    except* Exception as group:
        log.error("directing socket failed", exc_info=group)
        try:
            await websocket.close(status.WS_1011_INTERNAL_ERROR)
        except Exception:  # noqa: BLE001 - the socket may already be gone
            pass
    finally:
        unopened.cancel()
        state.directing.discard(session)
        session.outbox.closed = True
        session.detach(NOT_READING if session.outbox.dropped is not None else None)


def close_unopened(session: Session, timeout_s: float) -> None:
    """A socket that opened no session in time holds a --max-sessions place for nothing: closed."""
    if session.session_id is None:
        session.outbox.message(p.Error("session_not_open", f"no session.open within {timeout_s:g} s of "
                                                           "connecting; the socket is closed"))
        session.outbox.close(status.WS_1008_POLICY_VIOLATION, "no session.open")


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
                    await session.open(message)
                case p.Ping():
                    session.outbox.message(p.Pong(message.t, message.ref))
                case p.TakeCancel():
                    await session.cancel(message)
                case _:
                    session.require_open()
                    if isinstance(message, p.TakeStart) and not session.state.draining:
                        session.supersede()  # (draining: refused, and the running take goes on)
                    await commands.put(message)
        except p.ProtocolError as error:
            error.ref = message.ref
            report(session, error)
        except Exception as error:  # noqa: BLE001 - a fault of ours (a full disk, say): the socket stays usable
            failed(session, message, error)


async def run_commands(session: Session, commands: asyncio.Queue[p.ClientMessage]) -> None:
    while True:
        message = await commands.get()
        try:
            await session.handle(message)
        except p.ProtocolError as error:
            error.ref = message.ref
            report(session, error)
        except Exception as error:  # noqa: BLE001 - logged, and said to the client; the socket stays usable
            failed(session, message, error)


def failed(session: Session, message: p.ClientMessage, error: Exception) -> None:
    """A server fault while handling a message: `internal`, saying what went wrong in a line (a store
    that could not write says so: a full disk is the director's to know, not a traceback)."""
    if isinstance(error, sa.exc.SQLAlchemyError):
        text = problem(error)
        log.warning("%s could not be stored: %s", message.type, text)
    else:
        log.exception("handling %s failed", message.type)
        text = f"the server failed on {message.type}: {type(error).__name__}"
    session.outbox.message(p.Error("internal", text, None, message.ref, None))


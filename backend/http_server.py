"""uvicorn as Retake runs it: one configuration for `retake serve` and the tests, and the
WebSocket protocol with the limits uvicorn's leaves to the application.

    server = uvicorn.Server(uvicorn_config(app, settings, host=..., port=..., log_level="info"))

Design choices:
- `WebSocketProtocol` is uvicorn's sans-I/O WebSocket protocol (the `websockets-sansio`
  implementation) with four changes, each a defect found by a client that misbehaves:
  - a pong is not written while the connection's write buffer is full: a client that floods
    pings and reads nothing would otherwise pile its pongs up in our memory without bound;
  - a connection still open 10 s after its application returned, or after the keepalive
    ping went unanswered, is aborted: closing waits for the write buffer to drain, which a
    client that stopped reading never lets happen, so its socket would stay forever;
  - a text frame that is not UTF-8 closes the socket with 1007 and one log line (uvicorn logs
    a traceback per frame);
  - a send after the socket closed (1007 above, a keepalive timeout) is a disconnect for the
    application (uvicorn raises RuntimeError "Unexpected ASGI message").
- The access log goes through `RedactSecrets` (backend/admission.py): a secret someone put in
  a URL is printed as ***.
- Permessage-deflate is off (audio does not compress) and a frame may be at most
  `max_message_bytes` + 1 MiB (the application answers `message_too_big` below that).
"""

from __future__ import annotations

from typing import Any

import uvicorn
from uvicorn.protocols.utils import ClientDisconnected, get_client_addr, get_path_with_query_string
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from backend.admission import redact, redact_logs
from backend.settings import Settings


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def handle_ping(self) -> None:
        if self.writable.is_set():
            super().handle_ping()
        else:
            self.conn.data_to_send()  # the pong is dropped: the client has not read what we sent before it

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()
        self.drop_later()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        self.drop_later()

    def drop_later(self) -> None:
        """Abort the connection if it is still there after the close timeout: closing waits for the
        write buffer to drain, which a client that stopped reading never lets happen."""
        def drop() -> None:
            if not self.disconnected:
                self.transport.abort()

        self.loop.call_later(self.close_timeout, drop)

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                self.logger.info('%s - "WebSocket %s" closed with 1007: a text frame that is not UTF-8',
                                 get_client_addr(self.scope), redact(get_path_with_query_string(self.scope)))
                self.frames = []
                self.conn.send_close(1007, "text frames must be UTF-8")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()

    async def send(self, message: Any) -> None:
        if self.close_sent and self.initial_response is None and message["type"] in ("websocket.send",
                                                                                       "websocket.close"):
            raise ClientDisconnected  # the connection closed under the application (1007, keepalive)
        await super().send(message)


def uvicorn_config(app: Any, settings: Settings, *, host: str = "127.0.0.1", port: int = 8000,
                   log_level: str = "info") -> uvicorn.Config:
    redact_logs()
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          ws=WebSocketProtocol, ws_per_message_deflate=False,
                          ws_max_size=settings.limits.max_message_bytes + 2**20,
                          ws_ping_interval=settings.keepalive_s, ws_ping_timeout=settings.keepalive_s)

"""Admission: what every request and socket must pass before any route sees it (an ASGI middleware
around the whole app, so a route added later is covered by construction).

    app = Starlette(routes, middleware=[Middleware(Admission, settings=settings)])

In order, for HTTP requests and WebSocket handshakes alike:
1. Host: the `Host` header names this server (`localhost`, an IP address, `--host`, or an
   `--allow-host` name). Else HTTP 400: a page on `evil.example` that DNS-rebinds its name to
   127.0.0.1 reaches the server with `Host: evil.example` and stops here. A request without
   a Host (HTTP/1.0: a load balancer's health check) is not a browser's and passes.
2. Origin: a browser's `Origin` (when there is one) is one of this server's own origins
   (http or https, a name of 1. other than a foreign IP address, and the port the connection
   came in on), or listed by `--allow-origin`. Else HTTP 403. The origin is never compared
   with the Host header, which the page's author controls under rebinding.
3. Credential: with `--token`, everything but the studio's own files, `GET /health` and
   CORS preflights carries the token, as `Authorization: Bearer TOKEN` (scripts) or the
   `retake_token` cookie that `POST /auth` sets (the studio: browsers cannot put a header on
   a WebSocket). A token in the URL is refused, never read, so it does not end up in logs.
   Else HTTP 401 (403 for a WebSocket handshake, which browsers report the same way).
4. Body: state-changing requests with a form content type (`text/plain`,
   `application/x-www-form-urlencoded`, which a page can send anywhere without a preflight)
   are refused with 415; a body larger than `limits.max_message_bytes` is refused with 413,
   from its Content-Length before it is read, or as soon as the bytes read pass it.

Design choices:
- A pure ASGI middleware (no BaseHTTPMiddleware): it sees WebSocket handshakes too, and
  counts body bytes as they arrive without buffering them.
- A refused WebSocket gets an HTTP response at the handshake (the `websocket.http.response`
  extension, when the server has it; a plain close, which uvicorn answers with 403, when not),
  so no socket is ever accepted and no handler runs.
- Refusals that an operator can fix (an origin or host they meant to allow) are logged once
  per name with the option that allows it; the rest are counted by the access log only.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from backend.settings import Settings

log = logging.getLogger("retake.admission")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_COOKIE = "retake_token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
PUBLIC_PATHS = frozenset({"/", "/health"})  # besides the studio's built files
FORM_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECRET_PARAMETERS = frozenset({"token", "access_token", "session_key", "key"})


class Refused(Exception):
    """A request admission turns away: an HTTP status and a message that says what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BodyTooLarge(Exception):
    """Raised from `receive` once a request body passes the limit."""


def host_name(value: str) -> str:
    """The name in a Host header or an origin's authority, lower case, without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def served_names(settings: Settings) -> frozenset[str]:
    """The names the server answers to besides IP addresses: loopback, --host (a name), --allow-host."""
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in settings.allow_hosts}
    if settings.host not in WILDCARD_HOSTS:
        names.add(host_name(settings.host))
    return frozenset(names)


def bearer(headers: dict[str, str]) -> str | None:
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def cookie(headers: dict[str, str], name: str) -> str | None:
    try:
        jar = SimpleCookie(headers.get("cookie", ""))
    except CookieError:
        return None
    morsel = jar.get(name)
    return None if morsel is None else morsel.value


def token_given(headers: dict[str, str]) -> str | None:
    """The token the request carries (header first, then the studio's cookie)."""
    return bearer(headers) or cookie(headers, TOKEN_COOKIE)


def token_matches(given: str | None, token: str) -> bool:
    return given is not None and secrets.compare_digest(given.encode(), token.encode())


class Admission:
    """The ASGI middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.names = served_names(settings)
        self.static_dir = settings.static_dir.resolve()
        self.max_body = settings.limits.max_message_bytes
        self.told: set[str] = set()  # refused origins and hosts already logged

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            self.check(scope, headers)
        except Refused as refusal:
            await refuse(scope, receive, send, refusal)
            return
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            await self.limited(scope, receive, send, headers)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope, headers: dict[str, str]) -> None:
        host = host_name(headers.get("host", ""))
        # No Host at all is not a browser (they always send one): a load balancer's health check, say.
        if host and not (is_ip(host) or host in self.names):
            self.tell(f"host {host!r}", f"add --allow-host {host}" if host else "")
            raise Refused(400, f"this server does not answer to the name {host!r} (Host header); if it should, "
                               "start it with --allow-host NAME")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, scope):
            self.tell(f"origin {origin!r}", f"add --allow-origin {origin}")
            raise Refused(403, f"pages from {origin} may not use this server; start it with --allow-origin "
                               f"{origin} if they should")
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind in FORM_TYPES:
                raise Refused(415, f"a {kind} body is not accepted here; send application/json")
        token = self.settings.token
        if token is None or self.public(scope):
            return
        if not token_matches(token_given(headers), token):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if any(name in query for name in SECRET_PARAMETERS):
                raise Refused(401, "the token goes in the Authorization header (Bearer TOKEN), never in the URL")
            raise Refused(401, "a valid token is needed: send Authorization: Bearer TOKEN (the studio: open it "
                               "as /#token=TOKEN once)")

    def origin_allowed(self, origin: str, scope: Scope) -> bool:
        allowed = self.settings.allow_origins
        if "*" in allowed or origin in allowed:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        name = host_name(parts.netloc)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        server = scope.get("server") or (None, None)
        if name in self.names or name == host_name(str(server[0])):
            if port == server[1]:
                return True
            # Behind a proxy the page's origin has the proxy's port: the names given with --allow-host
            # are served there on the default port.
            return name in {host_name(h) for h in self.settings.allow_hosts} and parts.port is None
        return False

    def public(self, scope: Scope) -> bool:
        """The studio's own files and /health: readable without the token (they hold no session data)."""
        if scope["type"] != "http" or scope["method"] not in SAFE_METHODS:
            return False
        if scope["method"] == "OPTIONS":  # a CORS preflight carries no credentials
            return True
        path: str = scope["path"]
        if path in PUBLIC_PATHS:
            return True
        relative = os.path.normpath(path.lstrip("/"))
        if relative.startswith("..") or os.path.isabs(relative):
            return False
        return (self.static_dir / relative).is_file()

    def tell(self, what: str, fix: str) -> None:
        if what in self.told or len(self.told) > 256:
            return
        self.told.add(what)
        log.warning("refused a request for %s%s", what, f" ({fix} if it is yours)" if fix else "")

    async def limited(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        """Run the app with its body counted: 413 past `max_body` bytes."""
        length = headers.get("content-length")
        if length is not None and (not length.isascii() or not length.isdigit() or int(length) > self.max_body):
            await refuse(scope, receive, send, too_large(self.max_body))
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not started:
                await respond(send, too_large(self.max_body))


def too_large(limit: int) -> Refused:
    return Refused(413, f"request bodies are limited to {limit} bytes")


async def respond(send: Send, refusal: Refused) -> None:
    """An HTTP error response in the OpenAI shape the API uses (`{"error": {"message", ...}}`)."""
    kind = "authentication_error" if refusal.status == 401 else "invalid_request_error"
    body = json.dumps({"error": {"message": refusal.message, "type": kind, "param": None, "code": None}}).encode()
    await send({"type": "http.response.start", "status": refusal.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def refuse(scope: Scope, receive: Receive, send: Send, refusal: Refused) -> None:
    if scope["type"] == "http":
        await respond(send, refusal)
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = refusal.message.encode()
        await send({"type": "websocket.http.response.start", "status": refusal.status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008})


def redact(text: str) -> str:
    """A URL (or any log text) with the values of secret-looking query parameters replaced by ***."""
    if "?" not in text and "&" not in text:
        return text
    out = []
    for piece in text.split("&"):
        head, sep, _value = piece.partition("=")
        name = head.rsplit("?", 1)[-1].lower()
        out.append(f"{head}{sep}***" if sep and name in SECRET_PARAMETERS else piece)
    return "&".join(out)


class RedactSecrets(logging.Filter):
    """Keeps secrets out of uvicorn's log lines (the access log prints the URL with its query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def redact_logs() -> None:
    """Install the filter on uvicorn's loggers (once)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())


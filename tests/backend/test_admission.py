"""Admission on a real server (backend/admission.py): host, origin, token and body size, on every
route and socket, checked with raw requests whose Host and Origin headers the test chooses."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

from live_server import LiveServer, run
from raw_http import address, read_reply, request, upgrade

from backend.tools.client import Director

SOCKETS = ("/ws", "/converse", "/api/chat")
SPEECH = json.dumps({"input": "Hi.", "max_new_tokens": 2}).encode()
JSON = {"Content-Type": "application/json"}


def port_of(server: LiveServer) -> int:
    return address(server.http)[1]


def routes(server: LiveServer) -> list[tuple[str, str, bytes | None]]:
    """(method, path, body) of every HTTP route, the studio's page included."""
    return [("GET", "/", None), ("GET", "/health", None), ("GET", "/metrics", None),
            ("POST", "/v1/audio/speech", SPEECH), ("GET", "/sessions/x/takes/1.wav", None), ("POST", "/auth", b""),
            ("GET", "/converse/info", None), ("GET", "/v1/audio/voices", None),
            ("POST", "/v1/audio/voices", b"{}"), ("DELETE", "/v1/audio/voices/x", None),
            ("POST", "/sessions", b"{}"), ("POST", "/sessions/list", b'{"sessions": []}'),
            ("PATCH", "/sessions/x", b"{}"), ("POST", "/sessions/x/duplicate", b"{}")]


def test_a_rebound_host_name_is_refused_on_every_route_and_socket(make_server: Any) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host and
    Origin evil.example; the two match each other, and neither is this server's."""
    server = make_server(allow_origins=("http://studio.example",))
    port = port_of(server)
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    for path in SOCKETS:
        status, reply = upgrade(server.http, path, evil)
        assert status == 400, reply
        assert b"--allow-host" in reply
        assert upgrade(server.http, path, {"Origin": f"http://127.0.0.1:{port}"})[0] == 101
    for method, path, body in routes(server):
        status, _, reply = request(server.http, method, path, {**evil, **JSON}, body)
        assert status == 400, (method, path, reply)
        assert "does not answer to the name 'evil.example'" in json.loads(reply)["error"]["message"]
        assert request(server.http, method, path, {"Host": f"evil.example:{port}", **JSON}, body)[0] == 400


def test_names_the_server_answers_to(make_server: Any) -> None:
    server = make_server(allow_hosts=("studio.example",))
    port = port_of(server)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "10.1.2.3", "studio.example",
                 f"STUDIO.example:{port}"):
        assert request(server.http, "GET", "/health", {"Host": host})[0] == 200, host
    for host in ("studio.example.evil.example", "localhost.evil.example", "evil.example:80"):
        assert request(server.http, "GET", "/health", {"Host": host})[0] == 400, host
    assert request(server.http, "GET", "/health", {"Host": ""})[0] == 200  # no browser sends no Host


def test_origins_are_checked_against_the_servers_own_not_the_host_header(server: LiveServer,
                                                                        make_server: Any) -> None:
    port = port_of(server)
    own = (f"http://127.0.0.1:{port}", f"http://localhost:{port}")
    foreign = ("http://evil.example", f"http://evil.example:{port}", f"http://127.0.0.1:{port + 1}",
               f"http://10.9.9.9:{port}", "null", f"ftp://127.0.0.1:{port}")
    for path in SOCKETS:
        for origin in own:
            assert upgrade(server.http, path, {"Origin": origin})[0] == 101, origin
        for origin in foreign:
            status, reply = upgrade(server.http, path, {"Origin": origin})
            assert status == 403, (origin, reply)
        # The page's Host says evil.example too: still refused (no comparison with Host).
        assert upgrade(server.http, path, {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"})[0] \
            == 101
    for method, path, body in routes(server):
        for origin in foreign:
            status, _, reply = request(server.http, method, path, {"Origin": origin, **JSON}, body)
            assert status == 403, (method, path, origin, reply)
    behind_proxy = make_server(allow_hosts=("studio.example",), allow_origins=("https://partner.example",))
    for origin in ("https://studio.example", f"http://studio.example:{port_of(behind_proxy)}",
                   "https://partner.example"):
        assert upgrade(behind_proxy.http, "/ws", {"Host": "studio.example", "Origin": origin})[0] == 101, origin
    assert upgrade(behind_proxy.http, "/ws", {"Origin": "https://studio.example:8443"})[0] == 403


def test_pages_cannot_post_forms_or_text(server: LiveServer) -> None:
    """A cross-origin text/plain or form POST needs no preflight in a browser: refused either way."""
    port = port_of(server)
    for kind in ("text/plain", "application/x-www-form-urlencoded", "text/plain;charset=UTF-8"):
        status, _, reply = request(server.http, "POST", "/v1/audio/speech", {"Content-Type": kind}, SPEECH)
        assert status == 415, reply
        status, _, _ = request(server.http, "POST", "/v1/audio/speech",
                               {"Content-Type": kind, "Origin": "http://evil.example"}, SPEECH)
        assert status == 403
    status, _, reply = request(server.http, "POST", "/v1/audio/speech", {}, SPEECH)  # no content type
    assert status == 415 and "application/json" in json.loads(reply)["error"]["message"]
    status, headers, _ = request(server.http, "POST", "/v1/audio/speech",
                                 {**JSON, "Origin": f"http://127.0.0.1:{port}"}, SPEECH)
    assert status == 200 and headers["content-type"].startswith("audio/")


def test_allowed_origins_get_cors_answers(make_server: Any) -> None:
    server = make_server(allow_origins=("https://partner.example",))
    status, headers, _ = request(server.http, "OPTIONS", "/v1/audio/speech",
                                 {"Origin": "https://partner.example", "Access-Control-Request-Method": "POST",
                                  "Access-Control-Request-Headers": "content-type"})
    assert status == 200 and headers["access-control-allow-origin"] == "https://partner.example"
    status, headers, _ = request(server.http, "GET", "/health", {"Origin": "https://partner.example"})
    assert status == 200 and headers["access-control-allow-origin"] == "https://partner.example"


@contextlib.contextmanager
def access_log() -> Iterator[list[str]]:
    """uvicorn's access and connection log lines, as printed (from a server already started:
    starting one sets uvicorn's log levels)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep()
    loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    try:
        yield lines
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(level)


def test_the_token_travels_in_a_header_or_cookie_never_in_urls_or_logs(make_server: Any) -> None:
    server = make_server(token="s3cret-token")
    with access_log() as lines:
        use_the_token(server)
    logged = "\n".join(lines)
    assert "/metrics?token=***" in logged and "/ws?token=***" in logged, logged
    assert "s3cret-token" not in logged


def use_the_token(server: LiveServer) -> None:
    bearer = {"Authorization": "Bearer s3cret-token"}
    for method, path, body in routes(server)[2:]:  # the page and /health are public
        assert request(server.http, method, path, JSON, body)[0] == 401, path
        assert request(server.http, method, path, {"Authorization": "Bearer wrong", **JSON}, body)[0] == 401
        status, _, reply = request(server.http, method, f"{path}?token=s3cret-token", JSON, body)
        assert status == 401 and "never in the URL" in json.loads(reply)["error"]["message"]
    assert request(server.http, "GET", "/metrics", bearer)[0] == 200
    assert request(server.http, "GET", "/health")[0] == 200 and request(server.http, "GET", "/")[0] == 200
    for path in SOCKETS:
        assert upgrade(server.http, path)[0] == 401
        assert upgrade(server.http, f"{path}?token=s3cret-token")[0] == 401
        assert upgrade(server.http, path, bearer)[0] == 101

    # The studio: POST /auth once with the header, then the cookie opens the socket and the API.
    status, headers, _ = request(server.http, "POST", "/auth", bearer, b"")
    cookie = headers["set-cookie"]
    assert status == 200 and "retake_token=s3cret-token" in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    jar = {"Cookie": cookie.split(";", 1)[0]}
    assert request(server.http, "GET", "/metrics", jar)[0] == 200
    assert upgrade(server.http, "/ws", jar)[0] == 101
    assert request(server.http, "POST", "/auth", {"Authorization": "Bearer wrong"}, b"")[0] == 401

    async def director() -> None:
        client = await Director.connect(server.ws, token="s3cret-token")
        await client.open()
        await client.close()

    run(director())


def test_bodies_are_limited_before_they_are_read(make_server: Any) -> None:
    server = make_server(limits={"max_message_bytes": 64 * 1024})
    # A Content-Length past the limit is answered before a byte of the body is sent.
    host, port = address(server.http)
    with socket.create_connection((host, port), timeout=60) as client:
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 50000000\r\n\r\n")
        reply = read_reply(client)
    assert reply.startswith(b"HTTP/1.1 413"), reply
    assert b"limited to 65536 bytes" in reply
    # A chunked body is counted as it arrives.
    with socket.create_connection((host, port), timeout=60) as client:
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 16384
        try:
            for _ in range(64):
                client.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except OSError:
            pass  # the server answered and closed while the body was still coming
        reply = read_reply(client)
    assert reply.startswith(b"HTTP/1.1 413"), reply
    # Under the limit, the route answers (400: this is not a speech request).
    status, _, _ = request(server.http, "POST", "/v1/audio/speech", JSON, b'{"input": 5}')
    assert status == 400

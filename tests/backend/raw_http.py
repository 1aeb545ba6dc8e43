"""HTTP requests and WebSocket handshakes with exactly the headers a test gives (Host and Origin
included), on real sockets, for the admission and hardening tests."""

from __future__ import annotations

import http.client
import socket
from urllib.parse import urlsplit


def address(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def request(base: str, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body). A Host header in `headers` replaces the real one."""
    host, port = address(base)
    connection = http.client.HTTPConnection(host, port, timeout=60)
    try:
        given = dict(headers or {})
        connection.putrequest(method, path, skip_host="Host" in given, skip_accept_encoding=True)
        for name, value in given.items():
            connection.putheader(name, value)
        if body is not None and "Content-Length" not in given:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def read_reply(client: socket.socket) -> bytes:
    """An HTTP response's head and its Content-Length body, from a raw socket."""
    reply = b""
    while b"\r\n\r\n" not in reply and (chunk := client.recv(4096)):
        reply += chunk
    head = reply.split(b"\r\n\r\n", 1)[0].lower()
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length:")),
                  0)
    while len(reply) < len(head) + 4 + length and (chunk := client.recv(4096)):
        reply += chunk
    return reply


def upgrade(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A WebSocket handshake: (HTTP status, the response's head and whatever body came with it)."""
    host, port = address(base)
    given = {"Host": f"{host}:{port}", **(headers or {})}
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in given.items()), "Connection: Upgrade",
             "Upgrade: websocket", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    with socket.create_connection((host, port), timeout=60) as client:
        client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = client.recv(4096)
            if not chunk:
                break
            reply += chunk
        if not reply.startswith(b"HTTP/1.1 101"):
            client.settimeout(2)
            try:
                while chunk := client.recv(4096):
                    reply += chunk
            except TimeoutError:
                pass
    return int(reply.split(b" ", 2)[1]), reply


class RawWebSocket:
    """A WebSocket client on a plain socket: it sends the frames a test gives and reads nothing
    unless told to (a client that stopped reading, with a small receive buffer)."""

    def __init__(self, base: str, path: str, receive_buffer: int | None = None) -> None:
        host, port = address(base)
        self.socket = socket.socket()
        if receive_buffer is not None:  # before connecting, so the window is small from the start
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.socket.settimeout(60)
        self.socket.connect((host, port))
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: Upgrade", "Upgrade: websocket",
                 "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
        self.socket.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.socket.recv(1)  # one byte at a time: leave every frame after the head unread
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, opcode: int, payload: bytes) -> None:
        """One final frame, masked as a client's must be (with a zero key: the bytes go as they are)."""
        size = len(payload)
        if size < 126:
            header = bytes([0x80 | opcode, 0x80 | size])
        elif size < 65536:
            header = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
        else:
            header = bytes([0x80 | opcode, 0x80 | 127]) + size.to_bytes(8, "big")
        self.socket.sendall(header + b"\0\0\0\0" + payload)

    def text(self, text: str) -> None:
        self.send(0x1, text.encode())

    def ping(self, payload: bytes = b"") -> None:
        self.send(0x9, payload)

    def close(self) -> None:
        self.socket.close()

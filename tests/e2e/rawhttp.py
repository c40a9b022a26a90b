"""A raw-socket HTTP/1.1 client for tests where the exact bytes on the wire matter."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import orjson


@dataclass
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return orjson.loads(self.body)


def dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return bytes(out)


def send_raw(port: int, head: bytes, body: bytes = b"", timeout: float = 10.0) -> RawAnswer:
    """Send ``head`` (request line and headers, without the blank line) and ``body`` as
    they are, with ``Connection: close``; read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
        chunks = []
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            chunks.append(piece)
    data = b"".join(chunks)
    raw_head, _, rest = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        rest = dechunk(rest)
    return RawAnswer(status, headers, rest)


def read_request(conn: socket.socket, pending: bytes = b"") -> tuple[bytes, bytes, bytes] | None:
    """One request with a ``Content-Length`` (or none: no body) read from a server's side of
    ``conn``, ``pending`` being what came of it already: its head, its body and what came
    after them (the start of the next request); None when the peer closed before all of it."""
    while b"\r\n\r\n" not in pending:
        got = conn.recv(65536)
        if not got:
            return None
        pending += got
    head, _, pending = pending.partition(b"\r\n\r\n")
    length = int(next((line.split(b":", 1)[1] for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), b"0"))
    while len(pending) < length:
        got = conn.recv(65536)
        if not got:
            return None
        pending += got
    return head, pending[:length], pending[length:]

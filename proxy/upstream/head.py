"""Reading an HTTP/1.x response head and the framing of the body after it (pure)."""

from __future__ import annotations

from typing import NamedTuple

from multidict import CIMultiDict

__all__ = ["Framing", "ProtocolError", "framing", "header_fields", "status_line"]


class ProtocolError(Exception):
    """The upstream sent something that is not HTTP/1.1."""


class Framing(NamedTuple):
    mode: str  # "length" | "chunked" | "close"
    length: int  # bytes of a "length" body
    keep_alive: bool


def status_line(line: bytes) -> tuple[bytes, int]:
    """The version and status code of a status line."""
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {line[:80]!r}")
    return parts[0], int(parts[1])


def header_fields(lines: list[bytes]) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers.add(name.strip().decode("latin-1"), value.strip().decode("latin-1"))
    return headers


def framing(version: bytes, status: int, headers: CIMultiDict[str], no_body: bool) -> Framing:
    """How the body after this head ends, and whether the connection may carry another."""
    keep_alive = version == b"HTTP/1.1" and headers.get("Connection", "").lower() != "close"
    if no_body or status in (204, 304):
        return Framing("length", 0, keep_alive)
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        return Framing("chunked", -1, keep_alive)
    if "Content-Length" in headers:
        length = headers["Content-Length"]
        if not length.isdigit():
            raise ProtocolError(f"bad Content-Length {length!r}")
        return Framing("length", int(length), keep_alive)
    return Framing("close", -1, False)

"""HTTP/1.1 framing of one export post: the request's head, made once per endpoint, and the
collector's answer, read as its bytes arrive (the status, whether the connection may carry
the next post, and where the answer ends: Content-Length, chunked, or the connection's
close). Pure: bytes in, a verdict out; the socket is exporting.py's.

The body is an ExportServiceResponse whose partial-success counts are not read: it is
framed and counted, never kept. Everything a collector sends is untrusted, so each part is
bounded (the head's bytes and lines, the body's bytes, the bytes of chunk framing and
trailers) and anything that is not HTTP/1.x, or that contradicts itself (two lengths, a
transfer coding that does not end in chunked), is an ``AnswerError``: a failed post, its
connection closed, never a guess at where the next answer starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from proxy.upstream.chunked import ChunkedDecoder, ChunkedError

__all__ = ["MAX_BODY", "MAX_HEAD", "MAX_LINES", "Answer", "AnswerError", "request_head"]

MAX_HEAD = 16 * 1024  # a response head (a collector's is a few hundred bytes)
MAX_LINES = 64  # header lines in one head
MAX_BODY = 64 * 1024  # an ExportServiceResponse: a count and a message, at most
# Every byte read for one answer, framing and interim (1xx) heads included: what bounds a
# chunked body made of tiny chunks or endless trailers.
MAX_WIRE = 4 * MAX_BODY
_DIGITS = frozenset(b"0123456789")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name
_BAD_TARGET = re.compile(r"[^\x21-\x7e]")  # a space, a control or non-ASCII character
_BAD_VALUE = re.compile(r"[\r\n\x00]")
# Ours to say: the body's length is the one sent, and it is never chunked.
_FRAMING = frozenset({"content-length", "transfer-encoding"})


def request_head(path: str, host: str, port: int, https: bool,
                 headers: Mapping[str, str]) -> bytes | None:
    """The head of every post to ``path`` up to the Content-Length's value (the post adds
    it, then the body): the request line, Host (unless ``headers`` has one), the
    ``headers`` in their order, but for the framing ones. None when a part cannot go into a
    head unchanged (a line break would end it or start another request): every post fails
    (config.py vets the headers it reads; a URL is taken as it is set)."""
    if not path.startswith("/") or _BAD_TARGET.search(path):
        return None
    names = {name.lower() for name in headers}
    lines = [f"POST {path} HTTP/1.1\r\n"]
    if "host" not in names:
        try:
            name = host.encode("ascii").decode()
        except UnicodeEncodeError:
            try:
                name = host.encode("idna").decode()
            except UnicodeError:
                return None
        if _BAD_TARGET.search(name):
            return None
        name = f"[{name}]" if ":" in name else name
        default = 443 if https else 80
        lines.append(f"Host: {name}\r\n" if port == default else f"Host: {name}:{port}\r\n")
    if "accept-encoding" not in names:
        lines.append("Accept-Encoding: identity\r\n")  # an answer is counted, never decoded
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            return None
        if name.lower() not in _FRAMING:
            lines.append(f"{name}: {value}\r\n")
    lines.append("Content-Length: ")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        return None


class AnswerError(Exception):
    """The collector's answer is not one this client can read: the post failed."""


class Answer:
    """One answer to one request. ``feed`` each piece received; ``closed`` when the
    collector closed the connection. ``status`` and ``keep_alive`` are set once the head
    is read."""

    __slots__ = ("_chunked", "_held", "_left", "_mode", "_wire", "keep_alive", "status")

    def __init__(self) -> None:
        self.status = 0
        self.keep_alive = False
        self._held = b""  # the head so far
        self._mode = "head"  # head | length | chunked | close | done
        self._left = 0  # bytes of a Content-Length body still to come
        self._chunked: ChunkedDecoder | None = None
        self._wire = 0

    @property
    def done(self) -> bool:
        return self._mode == "done"

    def feed(self, data: bytes) -> bool:
        """True once the answer is complete. Bytes past its end leave the connection in an
        unknown state: not kept alive."""
        self._wire += len(data)
        if self._wire > MAX_WIRE:
            raise AnswerError("the answer is too large")
        mode = self._mode
        if mode == "head":
            data = self._head(data)
            mode = self._mode
            if mode == "head":
                return False
        if mode == "length":
            left = self._left - len(data)
            if left > 0:
                self._left = left
                return False
            self._left = 0
            if left < 0:  # more than the answer: the connection is not reusable
                self.keep_alive = False
            self._mode = "done"
            return True
        if mode == "chunked":
            return self._chunks(data)
        if mode == "close":
            self._left += len(data)
            if self._left > MAX_BODY:
                raise AnswerError("the answer's body is too large")
            return False
        if data:  # done already: more bytes than the answer
            self.keep_alive = False
        return True

    def closed(self) -> bool:
        """The collector closed the connection: True when that ends the answer (a body
        read until the close), else an ``AnswerError`` (the answer was cut short)."""
        self.keep_alive = False
        if self._mode == "close":
            self._mode = "done"
        if self._mode != "done":
            raise AnswerError("the collector closed the connection before its answer ended")
        return True

    def _head(self, data: bytes) -> bytes:
        """Take what ``data`` holds of the head; the rest of it, the body's start."""
        held = self._held + data if self._held else data
        while True:
            end = held.find(b"\r\n\r\n")
            if end < 0 or end > MAX_HEAD:
                if len(held) > MAX_HEAD:
                    raise AnswerError("the answer's head is too large")
                self._held = held
                return b""
            lines = held[:end].split(b"\r\n")
            held = held[end + 4:]
            status, version = _status_line(lines[0])
            if status >= 200:
                break
            # An interim answer (100 Continue): the real one follows (all of them within
            # the answer's bytes).
        self._held = b""
        self.status = status
        if len(lines) > MAX_LINES + 1:
            raise AnswerError("the answer has too many header lines")
        length, chunked, close = _framing(lines)
        self.keep_alive = version == b"HTTP/1.1" and not close
        if status in (204, 304):
            self._mode = "done"
        elif chunked:
            self._mode, self._chunked = "chunked", ChunkedDecoder()
            if length is not None:  # both: chunked wins, but the sender is confused
                self.keep_alive = False
        elif length is not None:
            if length > MAX_BODY:
                raise AnswerError("the answer's body is too large")
            self._mode, self._left = "length", length
            if not length:
                self._mode = "done"
        else:
            self._mode, self.keep_alive = "close", False
        return held

    def _chunks(self, data: bytes) -> bool:
        decoder = self._chunked
        assert decoder is not None
        try:
            self._left += len(decoder.feed(data))
        except ChunkedError as exc:
            raise AnswerError(f"the answer's chunked body is malformed: {exc}") from None
        if self._left > MAX_BODY:
            raise AnswerError("the answer's body is too large")
        if not decoder.ended:
            return False
        if decoder.extra:
            self.keep_alive = False
        self._mode = "done"
        return True


def _status_line(line: bytes) -> tuple[int, bytes]:
    """The status code and the version of ``HTTP/1.x NNN reason``."""
    version, _, rest = line.partition(b" ")
    code = rest[:3]
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 \
            or not _DIGITS.issuperset(code) or rest[3:4] not in (b"", b" ") \
            or code[0] == 0x30:
        # Never the line itself in the message: an error message may reach a log.
        raise AnswerError("the answer's status line is not HTTP/1.x")
    status = int(code)
    if status == 101:  # no upgrade was asked for
        raise AnswerError("the collector switched protocols")
    return status, version


def _framing(lines: list[bytes]) -> tuple[int | None, bool, bool]:
    """Content-Length (None: none), chunked, and whether the connection closes, from the
    header lines (``lines[0]``: the status line)."""
    length: int | None = None
    chunked = close = False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in (b" ", b"\t") or name[:1] in (b" ", b"\t"):
            # A line without a name, or folded onto the last (obsolete, and ambiguous).
            raise AnswerError("the answer has a malformed header line")
        name = name.lower()
        if name == b"content-length":
            found = value.strip()
            if not found or len(found) > 18 or not _DIGITS.issuperset(found) \
                    or (length is not None and int(found) != length):
                raise AnswerError("the answer's Content-Length is not one number")
            length = int(found)
        elif name == b"transfer-encoding":
            codings = [c.strip() for c in value.lower().split(b",")]
            if codings[-1] != b"chunked" or chunked:
                # A body whose end only its close would tell, on a kept-alive connection:
                # no way to know where the next answer starts.
                raise AnswerError("the answer's transfer coding does not end in chunked")
            chunked = True
        elif name == b"connection":
            close = close or b"close" in (t.strip() for t in value.lower().split(b","))
    return length, chunked, close

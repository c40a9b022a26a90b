"""Compressed request bodies: one rule for every route.

aiohttp's own request decompression is off (``auto_decompress=False``): it would hand the
handlers decompressed bytes while the headers still describe the compressed ones, so an
upstream could read the extra bytes as a second request. Instead tailfloor decodes
``gzip``/``x-gzip``/``deflate`` bodies itself, on every route, and the upstream receives the
decoded bytes with their own length and no ``Content-Encoding``. A body that does not decode
is refused with 400 ``invalid_body``; the body limit applies to the decoded size as well, and
decoding stops at the limit, so a small "zip bomb" costs at most ``limit`` bytes of memory.
Bodies in any other encoding: the chat route (which must read the JSON) refuses them with
415, other routes forward them as sent, headers and bytes unchanged.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping

from proxy.errors import BodyTooLarge, InvalidBody, UnsupportedEncoding

__all__ = ["MAX_MEMBERS", "Decoder", "body_encoding", "decode_stream", "decoded"]

_DECODED = frozenset({"gzip", "x-gzip", "deflate"})
_STEP = 1 << 20  # decompressed bytes produced per call, so memory stays bounded
# gzip members one body may have. Each new member costs a copy of the rest of its piece, so
# a body of thousands of empty 20-byte members costs time quadratic in a piece's size (0.15 s
# for one 256 KiB read) while producing nothing; a real client sends one member.
MAX_MEMBERS = 64


def body_encoding(headers: Mapping[str, str]) -> str | None:
    """The body's content coding in lower case; None for none or ``identity``."""
    value = headers.get("Content-Encoding", "").strip().lower()
    return value if value and value != "identity" else None


def decodable(encoding: str | None) -> bool:
    return encoding in _DECODED


class Decoder:
    """Incremental decoding of one body, bounded by ``limit`` decoded bytes."""

    def __init__(self, encoding: str, limit: int) -> None:
        if encoding not in _DECODED:
            raise UnsupportedEncoding(f"request bodies in {encoding!r} are not supported; "
                                      "send gzip, deflate or an uncompressed body")
        self._gzip = encoding != "deflate"
        self._limit = limit
        self._seen = 0
        self._first = True
        self._members = 1
        self._z = self._new(zlib.MAX_WBITS | 16 if self._gzip else zlib.MAX_WBITS)

    @staticmethod
    def _new(wbits: int) -> zlib._Decompress:
        return zlib.decompressobj(wbits=wbits)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of ``data``, each of at most 1 MiB and made when asked for (a small
        piece of a "zip bomb" stops costing as soon as its reader stops asking); raises
        ``InvalidBody`` / ``BodyTooLarge``."""
        pending = data
        while pending:
            if self._z.eof:
                if not self._gzip:
                    raise InvalidBody("the request body has bytes after its deflate stream")
                if not pending.strip(b"\x00"):
                    return  # zero padding after the last member, as gzip(1) allows
                # gzip allows several members one after another (RFC 1952 section 2.2).
                self._members += 1
                if self._members > MAX_MEMBERS:
                    raise InvalidBody(f"the request body has more than {MAX_MEMBERS} gzip "
                                      "members")
                self._z = self._new(zlib.MAX_WBITS | 16)
            try:
                piece = self._z.decompress(pending, _STEP)
            except zlib.error as exc:
                if self._first and not self._gzip:
                    # "deflate" bodies are sometimes raw deflate without the zlib wrapper.
                    self._first = False
                    self._z = self._new(-zlib.MAX_WBITS)
                    continue
                raise InvalidBody(f"the request body does not decompress: {exc}") from exc
            self._first = False
            self._count(piece)
            pending = self._z.unused_data if self._z.eof else self._z.unconsumed_tail
            if piece:
                yield piece

    def finish(self) -> list[bytes]:
        """The rest once the body has ended; raises ``InvalidBody`` if it was cut short."""
        try:
            piece = self._z.flush()
        except zlib.error as exc:
            raise InvalidBody(f"the request body does not decompress: {exc}") from exc
        self._count(piece)
        if not self._z.eof:
            raise InvalidBody("the compressed request body ends before its end marker")
        return [piece] if piece else []

    def _count(self, piece: bytes) -> None:
        self._seen += len(piece)
        if self._seen > self._limit:
            raise BodyTooLarge(f"the decompressed request body is over the {self._limit}-byte "
                               "limit")


async def decode_stream(pieces: AsyncIterator[bytes], encoding: str, limit: int
                        ) -> AsyncIterator[bytes]:
    """A body decoded as it streams in."""
    async for out in decoded(pieces, Decoder(encoding, limit)):
        yield out


async def decoded(pieces: AsyncIterator[bytes], decoder: Decoder) -> AsyncIterator[bytes]:
    """``pieces`` decoded by ``decoder`` (which may have decoded the body's start already),
    the event loop given a turn between two pieces decoded from one piece received."""
    async for piece in pieces:
        for index, out in enumerate(decoder.feed(piece)):
            if index:
                await asyncio.sleep(0)
            yield out
    for out in decoder.finish():
        yield out

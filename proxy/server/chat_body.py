"""The chat route's body as it arrives: decoded, within the limit both ways, at the minimum
rate at least, every decoded byte held in the body budget (``held_bodies.py``).

A body is parsed only up to ``MAX_PARSED_BYTES`` (decoded), so a longer one is not held whole
either: once past that bound, ``read_body`` stops and returns a ``Spill``, what was read and
the rest as it arrives (decoded, under the same limit and pace), which the route forwards
unread. The most a body holds while read is that bound and one piece, whatever its length or
coding; a compressed piece is decoded a MiB at a time, the event loop given a turn between.

A compressed body is held as it came until it ends (or its compressed bytes pass the bound):
decoded as it arrived, a few KB of a "zip bomb" followed by silence would hold MiBs of the
budget for as long as the body may take. And the time a body may take grows with what it
sent (``BodyPace``): a client that sends a little and stops is cut off after the grace, not
after the time its declared (or the largest) length would take.
"""

from __future__ import annotations

import asyncio
import collections
import io
from collections.abc import AsyncIterator, Iterator

from aiohttp import web

from proxy.errors import BodyTooLarge, Busy, UnsupportedEncoding
from proxy.server.body import Decoder, body_encoding, decodable, decoded
from proxy.server.body_cost import MAX_PARSED_BYTES
from proxy.server.draining import BodyReads
from proxy.server.held_bodies import Hold
from proxy.server.passthrough import BodyPace, limited

__all__ = ["Spill", "read_body"]

_PIECE = 1024 * 1024  # the start of a spilled body goes upstream a piece at a time


class Spill:
    """A body past the parse bound: its start, read, and the rest still to come."""

    def __init__(self, head: bytes, rest: AsyncIterator[bytes], hold: Hold) -> None:
        self._head = head
        self._rest = rest
        self._hold = hold

    async def body(self) -> AsyncIterator[bytes]:
        head, self._head = self._head, b""
        for start in range(0, len(head), _PIECE):
            yield head[start:start + _PIECE]  # a MiB at a time: no long write, no long copy
        sent = len(head)
        del head  # sent: not kept while the rest streams (nor counted in the budget)
        self._hold.give_back(sent)
        async for piece in self._rest:
            yield piece


async def read_body(request: web.Request, limit: int, *, rate: int, grace: float,
                    hold: Hold, reads: BodyReads) -> bytes | Spill:
    """The body (decoded), or its ``Spill`` when it is longer than a body is parsed; by the
    drain's body deadline once the drain began."""
    length = request.content_length
    if length is not None and length > limit:
        raise BodyTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
    encoding = body_encoding(request.headers)
    if encoding is not None and not decodable(encoding):
        raise UnsupportedEncoding(f"chat request bodies in {encoding!r} are not supported; "
                                  "send gzip, deflate or an uncompressed body")
    reader = _Reader(limit, hold, Decoder(encoding, limit) if encoding is not None else None)
    content = request.content
    if content.is_eof() and content.exception() is None:
        # The whole body came with the head (most requests): no timer to arm.
        whole = content.read_nowait()
        if reader.decoder is None:  # kept as it came, not copied
            taken = reader.taken(whole)
            return taken if len(taken) <= MAX_PARSED_BYTES else Spill(taken, _nothing(), hold)
        if await reader.add(whole) or await reader.decode_held():
            return reader.spill(_nothing())
        return reader.body()
    # The same pace as any forwarded body; a spill goes on reading from the same pieces.
    pieces = limited(content.iter_any(), limit, BodyPace(grace, rate), reads)
    async for chunk in pieces:
        if await reader.add(chunk):
            return reader.spill(pieces)
    if await reader.decode_held():
        return reader.spill(_nothing())
    return reader.body()


class _Reader:
    def __init__(self, limit: int, hold: Hold, decoder: Decoder | None) -> None:
        self.limit, self.hold, self.decoder = limit, hold, decoder
        self.received = 0  # bytes as sent (compressed ones included)
        self._buffer = io.BytesIO()  # grows in place: no second copy to join the pieces
        self._pending: Iterator[bytes] = iter(())  # the decoded rest of the last piece
        # A compressed body's pieces as they came, until it ends or they pass the bound
        # (None once decoding began); and what of them the budget still holds.
        self._compressed: list[bytes] | None = [] if decoder is not None else None
        self._compressed_held = 0

    def taken(self, piece: bytes) -> bytes:
        """``piece`` counted against the limit and held in the budget."""
        if self.received + len(piece) > self.limit:
            raise BodyTooLarge(f"request body is over the {self.limit}-byte limit")
        if not self.hold.take(len(piece)):
            raise Busy("tailfloor holds as many request bodies as it may; retry shortly")
        self.received += len(piece)
        return piece

    async def add(self, chunk: bytes) -> bool:
        """Take ``chunk``; True once the body is past the parse bound (then the rest of its
        decoded pieces is left for ``spill``)."""
        if self.decoder is None:
            self._buffer.write(self.taken(chunk))
            return self._buffer.tell() > MAX_PARSED_BYTES
        if self._compressed is not None:
            self._compressed.append(self.taken(chunk))
            self._compressed_held += len(chunk)
            return self._compressed_held > MAX_PARSED_BYTES and await self.decode_held()
        if self.received + len(chunk) > self.limit:
            raise BodyTooLarge(f"request body is over the {self.limit}-byte limit")
        self.received += len(chunk)
        return await self._decoded(self.decoder.feed(chunk))

    async def decode_held(self) -> bool:
        """The compressed pieces held so far, decoded (the body ended, or they passed the
        bound; later pieces are decoded as they come); True once past the parse bound (the
        rest of them then decoded as the spill is sent)."""
        held, self._compressed = self._compressed, None
        if not held or self.decoder is None:
            return False
        queue = collections.deque(held)
        del held  # the queue alone holds the pieces: each is let go once fed
        return await self._decoded(self._held_pieces(queue, self.decoder))

    def _held_pieces(self, held: collections.deque[bytes], decoder: Decoder) -> Iterator[bytes]:
        """The decoded pieces of ``held``, each compressed piece given back to the budget once
        fed; an empty piece after each, a turn for the event loop even when one decodes to
        nothing."""
        while held:
            compressed = held.popleft()
            yield from decoder.feed(compressed)
            self.hold.give_back(len(compressed))
            self._compressed_held -= len(compressed)
            del compressed
            yield b""

    async def _decoded(self, pieces: Iterator[bytes]) -> bool:
        for index, piece in enumerate(pieces):
            if index:
                await asyncio.sleep(0)
            if not piece:
                continue
            if not self.hold.take(len(piece)):
                raise Busy("tailfloor holds as many request bodies as it may; retry shortly")
            self._buffer.write(piece)
            if self._buffer.tell() > MAX_PARSED_BYTES:
                self._pending = pieces
                return True
        return False

    def body(self) -> bytes:
        if self.decoder is not None:
            for piece in self.decoder.finish():
                if not self.hold.take(len(piece)):
                    raise Busy("tailfloor holds as many request bodies as it may; retry "
                               "shortly")
                self._buffer.write(piece)
        return self._buffer.getvalue()

    def spill(self, tail: AsyncIterator[bytes]) -> Spill:
        head = self._buffer.getvalue()
        self._buffer = io.BytesIO()
        return Spill(head, self._rest(tail), self.hold)

    async def _rest(self, tail: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        for piece in self._pending:
            if piece:  # an empty piece is only a turn; sent, it would end a chunked body
                yield piece
            await asyncio.sleep(0)
        if self.decoder is None:
            async for piece in tail:
                yield piece
        else:
            async for piece in decoded(tail, self.decoder):
                yield piece


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that yields nothing

"""A small HTTP/1.1 client connection, built on asyncio.Protocol for a short hot path.

A general-purpose client spends most of a sub-millisecond budget on features a reverse proxy
to one upstream does not need (cookies, redirects, tracing hooks, per-request timeout
objects). This one writes a request in one call, parses the response head with plain bytes
operations, and hands body pieces to the reader as they arrive (Content-Length, chunked, or
until close). Read timeouts arm a timer only while someone is waiting.

A stream being relayed can take its pieces from the protocol callback itself (``relay_to``):
waking a task for every SSE event cost more than relaying the event.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import cast

from multidict import CIMultiDict

from proxy.upstream.chunked import ChunkedDecoder, ChunkedError
from proxy.upstream.head import ProtocolError, framing, header_fields, status_line

__all__ = ["ConnectionClosed", "Http1Connection", "ProtocolError", "ReadTimeout"]

MAX_HEAD = 64 * 1024
_JOIN_BELOW = 64 * 1024  # smaller bodies leave in the head's write (one segment)
_WRITEV_FROM = 8 * 1024  # from this size the head's write is a writev (no copy to join)
HIGH_WATER = 4 * 1024 * 1024


class ConnectionClosed(Exception):
    """The connection ended before the response was complete."""


class ReadTimeout(Exception):
    """Nothing arrived within the read timeout."""


class Http1Connection(asyncio.Protocol):
    """One upstream connection carrying one request at a time."""

    def __init__(self, read_timeout: float) -> None:
        self.read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.reusable = False
        self.response_started = False
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._head: asyncio.Future[tuple[int, CIMultiDict[str]]] | None = None
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._queued = 0
        self._paused = False
        self._error: BaseException | None = None
        self._done = True
        self._remaining = -1  # bytes left of a Content-Length body or of the current chunk
        self._mode = ""  # "length" | "chunked" | "close" | ""
        self._chunked: ChunkedDecoder | None = None
        self._keep_alive = True
        self._no_body = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        # One read timer per connection, re-armed lazily: arming and cancelling a timer for
        # every body piece cost more than the piece's relay on a fast stream.
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._sink: Callable[[bytes], bool] | None = None
        self._sink_paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._stop_timer()
        if self._mode == "close" and not self._done:
            self._finish()
        elif not self._done or (self._head is not None and not self._head.done()):
            self._fail(ConnectionClosed("the upstream closed the connection"))
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        sink = self._sink
        if (sink is not None and not self._sink_paused and not self._done
                and self._mode == "chunked"):
            # A relayed stream's piece (the hot path: one call per SSE event): decoded and
            # handed to the sink here, without the general path's calls in between.
            decoder = self._chunked
            assert decoder is not None
            try:
                body = decoder.feed(data)
            except ChunkedError as exc:
                self._fail(ProtocolError(str(exc)))
                return
            if decoder.ended:
                if decoder.extra:
                    self._keep_alive = False
                self._push(body)
                self._finish()
            elif body:
                # A piece arrived: the silence the read timeout measures starts again.
                self._deadline = self.loop.time() + self.read_timeout
                try:
                    ready = sink(body)
                except Exception as exc:  # a bug in the sink ends this answer, not the loop
                    self._fail(exc)
                    return
                if not ready:
                    self._pause_relay()
            return
        if self._head is not None and not self._head.done():
            self._buffer += data
            if self._buffer.find(b"\r\n\r\n") < 0:  # (``in`` first tries an int: slower)
                if len(self._buffer) > MAX_HEAD:
                    self._fail(ProtocolError("response head over 64 KiB"))
                return
            try:
                rest = self._parse_head()
            except ProtocolError as exc:
                self._fail(exc)
                return
            if rest:
                self._body_received(rest)
            return
        if not self._done:
            self._body_received(data)
        elif data:
            # Bytes after a complete response: the connection is no longer in a known state.
            self.reusable = False

    # the request side
    def start_request(self, head: bytes, body: bytes | None, no_body: bool) -> None:
        assert self.transport is not None
        self._reset(no_body)
        if body and len(body) > _JOIN_BELOW:
            # Joining would copy a large body once more on the event loop.
            self.transport.write(head)
            self.transport.write(body)
        elif body and len(body) >= _WRITEV_FROM:
            # One segment, as a joined write: uvloop sends both in one writev, the body not
            # copied (asyncio's transports join them).
            self.transport.writelines((head, body))
        else:
            self.transport.write(head + body if body else head)

    async def write_body_chunk(self, *parts: bytes) -> None:
        """Write ``parts`` one after the other (a large piece is never copied to join it to
        its chunk framing), then wait while the transport's buffer is full."""
        assert self.transport is not None
        for data in parts:
            self.transport.write(data)
        if self._write_paused:
            self._drain_waiter = self.loop.create_future()
            await self._drain_waiter

    async def read_head(self) -> tuple[int, CIMultiDict[str]]:
        assert self._head is not None
        if not self._head.done():
            timer = self.loop.call_later(self.read_timeout, self._timeout)
            try:
                await asyncio.shield(self._head)
            finally:
                timer.cancel()
        return self._head.result()

    async def next_chunk(self) -> bytes:
        """The next body piece, or b"" at the end of the body."""
        chunks = self._chunks
        while not chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._arrival()
        chunk = chunks.popleft()
        self._queued -= len(chunk)
        if self._paused and self._queued < HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def relay_to(self, sink: Callable[[bytes], bool]) -> None:
        """From now on every body piece goes to ``sink`` as it arrives (pieces already queued
        first). ``sink`` returns False to have reading paused until ``resume_relay``, which
        ``wait_relay`` then reports; an exception in it ends the answer with that error."""
        self._sink = sink
        self._sink_queued()

    async def wait_relay(self) -> bool:
        """Wait while ``relay_to`` relays: True at the end of the body, False when the sink
        asked for a pause. Raises what broke the answer (as ``next_chunk`` does)."""
        while True:
            if self._error is not None:
                raise self._error
            if self._done and not self._chunks:
                return True
            if self._sink_paused:
                return False
            await self._arrival()

    def resume_relay(self) -> None:
        if self._sink_paused:
            self._sink_paused = False
            self._sink_queued()

    def _sink_queued(self) -> None:
        """Hand the queued pieces to the sink, then let the upstream send again."""
        chunks = self._chunks
        while chunks and not self._sink_paused and self._error is None:
            chunk = chunks.popleft()
            self._queued -= len(chunk)
            self._to_sink(chunk)
        if (self._paused and not self._sink_paused and self.transport is not None
                and not self._done):
            self._paused = False
            self.transport.resume_reading()

    def _to_sink(self, data: bytes) -> None:
        assert self._sink is not None
        try:
            ready = self._sink(data)
        except Exception as exc:  # a bug in the sink ends this answer, not the loop
            self._fail(exc)
            return
        if not ready:
            self._pause_relay()

    async def _arrival(self) -> None:
        """Wait for the next piece, the end or an error (the read timer armed meanwhile)."""
        loop = self.loop
        self._waiter = loop.create_future()
        self._deadline = loop.time() + self.read_timeout
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._check_timeout)
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _pause_relay(self) -> None:
        self._sink_paused = True
        if not self._paused and self.transport is not None and not self._done:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _check_timeout(self) -> None:
        """The read timer: a timeout only if the current wait began ``read_timeout`` ago;
        otherwise armed again for the current wait's deadline (or left off while nobody
        waits: the next wait arms it)."""
        self._timer = None
        if self._waiter is None or self._waiter.done():
            return
        if self.loop.time() >= self._deadline:
            self._timeout()
        else:
            self._timer = self.loop.call_at(self._deadline, self._check_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def complete(self) -> bool:
        return self._done and not self._chunks and self._error is None

    def close(self) -> None:
        self.reusable = False
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    # internals
    def _reset(self, no_body: bool) -> None:
        self._buffer.clear()
        self._chunks.clear()
        self._queued = 0
        self._error = None
        self._done = False
        self._mode = ""
        self._chunked = None
        self._remaining = -1
        self._no_body = no_body
        self._sink = None
        self._sink_paused = False
        self.response_started = False
        self.reusable = False
        self._head = self.loop.create_future()

    def _parse_head(self) -> bytes:
        end = self._buffer.index(b"\r\n\r\n")
        raw = bytes(self._buffer[:end])
        rest = bytes(self._buffer[end + 4:])
        self._buffer.clear()
        self.response_started = True
        lines = raw.split(b"\r\n")
        version, status = status_line(lines[0])
        if 100 <= status < 200:
            # Interim answers (100 Continue) carry no body; wait for the real one.
            self._buffer += rest
            if self._buffer.find(b"\r\n\r\n") >= 0:
                return self._parse_head()
            self.response_started = False
            return b""
        headers = header_fields(lines[1:])
        self._mode, self._remaining, self._keep_alive = framing(version, status, headers,
                                                                self._no_body)
        if self._mode == "chunked":
            self._chunked = ChunkedDecoder()
        assert self._head is not None
        self._head.set_result((status, headers))
        if self._mode == "length" and self._remaining == 0:
            self._finish()
        return rest

    def _body_received(self, data: bytes) -> None:
        if self._mode == "length":
            if len(data) >= self._remaining:
                if len(data) > self._remaining:
                    self._keep_alive = False
                self._push(data[:self._remaining])
                self._remaining = 0
                self._finish()
            else:
                self._remaining -= len(data)
                self._push(data)
        elif self._mode == "chunked":
            try:
                self._decode_chunked(data)
            except ProtocolError as exc:
                self._fail(exc)
        else:
            self._push(data)

    def _decode_chunked(self, data: bytes) -> None:
        decoder = self._chunked
        assert decoder is not None
        try:
            body = decoder.feed(data)
        except ChunkedError as exc:
            raise ProtocolError(str(exc)) from exc
        if decoder.ended and decoder.extra:
            self._keep_alive = False
        self._push(body)
        if decoder.ended:
            self._finish()

    def _push(self, data: bytes) -> None:
        if not data:
            return
        if self._sink is not None and not self._sink_paused:
            # A piece arrived: the silence the read timeout measures starts again.
            self._deadline = self.loop.time() + self.read_timeout
            self._to_sink(data)
            return
        self._chunks.append(data)
        self._queued += len(data)
        if self._queued > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self.reusable = self._keep_alive
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self.reusable = False
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # marks it retrieved when nobody awaits it
        self._wake()
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _timeout(self) -> None:
        self._fail(ReadTimeout(f"nothing received for {self.read_timeout:g} s"))

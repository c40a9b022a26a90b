"""Copying an upstream answer to the client as it arrives.

Streams are relayed chunk by chunk, never buffered or merged. While a stream is open and idle,
an SSE comment keeps intermediaries from timing it out; it is written only between events.
An upstream that breaks mid-stream gets the client stream ended cleanly with an OpenAI-shaped
error event, so SDKs raise a readable error instead of hanging or reporting a protocol error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from aiohttp import web
from aiohttp.http_writer import StreamWriter

from proxy.errors import ProxyError, UpstreamTimeout, unlinked
from proxy.server.sse import StreamScanner
from proxy.upstream.pool import UpstreamResponse

KEEPALIVE = b": keep-alive\n\n"
DRAIN_ABOVE = 0x10000  # bytes waiting in the client's buffer before the relay waits for it


@dataclass(slots=True)
class StreamOutcome:
    """What happened while relaying a stream; the handler turns it into metrics."""

    first_chunk_at: float | None = None
    proxy_seconds: float = 0.0
    keepalives: int = 0
    upstream_error: ProxyError | None = None
    client_gone: bool = False  # a write found the client gone: nothing more was sent
    error_event: bool = False  # the upstream itself ended its stream with an error event

    @property
    def broke(self) -> str | None:
        """How the answer ended short of whole, as telemetry and the inspector name it:
        ``timeout`` or ``mid_stream`` (the upstream went silent or broke off; the client
        got tailfloor's error event), ``error_event`` (the upstream sent one); None when
        the stream ended as it should."""
        if self.upstream_error is not None:
            return broken_kind(self.upstream_error)
        return "error_event" if self.error_event else None


def broken_kind(exc: ProxyError) -> str:
    """A stream the upstream broke: ``timeout`` (it went silent) or ``mid_stream``."""
    return "timeout" if isinstance(exc, UpstreamTimeout) else "mid_stream"


async def relay_stream(
    request: web.Request, response: web.StreamResponse, upstream: UpstreamResponse,
    scanner: StreamScanner, keepalive_interval: float, *,
    before_end: Callable[[], Awaitable[None]] | None = None,
) -> StreamOutcome:
    """Relay an SSE body. The response must already be prepared. A client that leaves ends
    the relay (``client_gone``); an upstream that breaks ends it with an error event."""
    outcome = StreamOutcome()
    clock = time.perf_counter  # the keep-alive's clock too: the relay reads it anyway
    state = _IdleState(clock())
    keeper = (_KeepAlive(response, scanner, state, keepalive_interval, outcome)
              if keepalive_interval > 0 else None)
    client = _ClientWrites(response)
    try:
        # Until the client's writer is known (its first write sends the head), pieces are
        # awaited one by one; after that they are relayed from the upstream's callback.
        while not client.direct:
            chunk = await upstream.next_piece()
            if not chunk:
                break
            started = clock()
            if outcome.first_chunk_at is None:
                outcome.first_chunk_at = started
            data = scanner.feed(chunk)
            state.writing = True
            if data:
                await client.write(data)
            state.writing = False
            state.last_write = now = clock()
            outcome.proxy_seconds += now - started
        else:
            await upstream.pipe(_Sink(scanner, client, state, outcome), client.drain)
        rest = scanner.flush()
        if rest:
            await client.write(rest)
    except ProxyError as exc:
        outcome.upstream_error = unlinked(exc)
    except ConnectionError:
        outcome.client_gone = True
    finally:
        if keeper is not None:
            keeper.cancel()
    try:
        if outcome.upstream_error is not None:
            await response.write(_broken(outcome.upstream_error, scanner))
        if not outcome.client_gone:
            if before_end is not None:
                # What the answer showed is acted on before the client has all of it: an
                # agent's next request can never overtake it (a silent overflow's mark).
                await before_end()
            await response.write_eof()
    except ConnectionError:
        outcome.client_gone = True
    return outcome


def _broken(exc: ProxyError, scanner: StreamScanner) -> bytes:
    """The error event that ends a stream the upstream broke, in the client's dialect."""
    kind = broken_kind(exc)
    message = f"{exc.message}; the response is incomplete"
    event = {"error": {"message": message, "type": "upstream_error", "param": None,
                       "code": f"upstream_{kind}"}}
    prefix = b"" if scanner.at_event_boundary else b"\n\n"
    written = (b"data: " + orjson.dumps(event) + b"\n\n" if scanner.dialect is None
               else scanner.dialect.stream_error(message, f"upstream_{kind}"))
    return prefix + written


class _ClientWrites:
    """The relay's writes to the client. The first goes through the response (the head leaves
    with it); the rest go to the transport as one pre-framed write each, with aiohttp's checks
    kept (a closing transport is a client gone, a drain once 64 KiB wait to be sent) and
    none of its per-write layers, which cost more than the event itself."""

    __slots__ = ("_decided", "_response", "_writer", "chunked", "transport")

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._writer: StreamWriter | None = None
        self._decided = False
        # Kept once the writer is known: a transport, once closed, stays closing, so the
        # callback need not look it up through aiohttp's protocol each time.
        self.transport: asyncio.Transport | None = None
        self.chunked = False

    async def write(self, data: bytes) -> None:
        writer = self._writer
        if writer is None:
            await self._response.write(data)
            if not self._decided:
                self._decided = True
                found = getattr(self._response, "_payload_writer", None)
                # Only aiohttp's own HTTP/1.x writer, uncompressed and without a declared
                # length, is framed here; anything else keeps going through the response.
                if (isinstance(found, StreamWriter) and not self._response.compression
                        and found.length is None and found.transport is not None):
                    self._writer = found
                    self.transport = found.transport
                    self.chunked = found.chunked
            return
        transport = self.transport
        assert transport is not None
        if transport.is_closing() or not _put(writer, transport, self.chunked, data):
            await self.drain()  # raises when the client is gone

    @property
    def direct(self) -> bool:
        """Writes go to the transport pre-framed from now on (``_Sink``)."""
        return self._writer is not None

    @property
    def writer(self) -> StreamWriter:
        assert self._writer is not None
        return self._writer

    async def drain(self) -> None:
        writer = self._writer
        assert writer is not None
        transport = writer.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        await writer.drain()


class _Sink:
    """What the upstream's callback does with each piece of a stream being relayed: scan it
    and write it to the client's transport, in one call (this runs once per SSE event, where
    every call and lookup shows)."""

    __slots__ = ("_chunked", "_feed", "_outcome", "_state", "_transport", "_writer")

    def __init__(self, scanner: StreamScanner, client: _ClientWrites, state: _IdleState,
                 outcome: StreamOutcome) -> None:
        assert client.transport is not None
        self._feed, self._state, self._outcome = scanner.feed, state, outcome
        self._writer, self._transport, self._chunked = (client.writer, client.transport,
                                                        client.chunked)

    def __call__(self, chunk: bytes) -> bool:
        clock = time.perf_counter
        started = clock()
        data = self._feed(chunk)
        ready = True
        if data:
            transport = self._transport
            if transport.is_closing():
                ready = False  # the client is gone: the drain that follows raises
            else:
                size = len(data)
                transport.write(b"%x\r\n%b\r\n" % (size, data) if self._chunked else data)
                self._writer.output_size += size
                ready = transport.get_write_buffer_size() <= DRAIN_ABOVE
        self._state.last_write = now = clock()
        self._outcome.proxy_seconds += now - started
        return ready


def _put(writer: StreamWriter, transport: asyncio.Transport, chunked: bool, data: bytes
         ) -> bool:
    """One pre-framed write; False when the client's buffer is over ``DRAIN_ABOVE``."""
    size = len(data)
    transport.write(b"%x\r\n%b\r\n" % (size, data) if chunked else data)
    writer.output_size += size
    return transport.get_write_buffer_size() <= DRAIN_ABOVE


@dataclass(slots=True)
class _IdleState:
    last_write: float
    writing: bool = False


class _KeepAlive:
    """An SSE comment to the client once the stream was idle for ``interval``, between
    events only. A timer that looks at the idle time when it fires, and a task only for a
    write: a task per stream, woken and cancelled, cost more than a short stream's events."""

    __slots__ = ("_handle", "_interval", "_loop", "_outcome", "_response", "_scanner",
                 "_state", "_writing")

    def __init__(self, response: web.StreamResponse, scanner: StreamScanner,
                 state: _IdleState, interval: float, outcome: StreamOutcome) -> None:
        self._response, self._scanner, self._state = response, scanner, state
        self._interval, self._outcome = interval, outcome
        self._loop = asyncio.get_running_loop()
        self._writing: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(interval, self._due)

    def _due(self) -> None:
        state = self._state
        idle = time.perf_counter() - state.last_write  # the relay's clock
        if idle < self._interval:
            self._handle = self._loop.call_later(self._interval - idle, self._due)
            return
        if self._writing is None and not state.writing and self._scanner.at_event_boundary:
            self._writing = self._loop.create_task(self._write())
        state.last_write = time.perf_counter()
        self._handle = self._loop.call_later(self._interval, self._due)

    async def _write(self) -> None:
        try:
            await self._response.write(KEEPALIVE)
        except (ConnectionError, RuntimeError):
            self._stop_timer()  # the client is gone; the relay notices on its next write
            return
        finally:
            self._writing = None
        self._outcome.keepalives += 1
        self._state.last_write = time.perf_counter()

    def _stop_timer(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def cancel(self) -> None:
        self._stop_timer()
        if self._writing is not None:
            self._writing.cancel()

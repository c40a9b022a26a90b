"""The relay's writes to the client: one write per upstream read, never two reads merged.

An upstream connection relays to the sink the relay uses; the client's transport records its
writes. The oracle is the chunk data each upstream read carried, framed here as the client's
chunked body: events the upstream wrote apart reach the client apart, byte for byte.
"""

from __future__ import annotations

import asyncio

from aiohttp.http_writer import StreamWriter

from proxy.server import relay
from proxy.server.sse import StreamScanner
from proxy.upstream.http1 import Http1Connection

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Protocol:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport


class Response:
    """What the relay needs of aiohttp's response: a first write, its payload writer."""

    compression = False

    def __init__(self, writer: StreamWriter) -> None:
        self._payload_writer = writer

    async def write(self, data: bytes) -> None:
        await self._payload_writer.write(data)


def event(n: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % n


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def relayed(reads: list[list[bytes]]) -> list[bytes]:
    """The client's writes after the first event, for upstream reads of these chunks."""
    loop = asyncio.get_running_loop()
    client_transport = Transport()
    writer = StreamWriter(Protocol(client_transport), loop)  # type: ignore[arg-type]
    writer.enable_chunking()
    client = relay._ClientWrites(Response(writer))  # type: ignore[arg-type]
    await client.write(event(0))  # the first event goes through the response
    assert client.direct
    client_transport.written.clear()
    upstream = Http1Connection(5.0)
    upstream.connection_made(Transport())  # type: ignore[arg-type]
    upstream.start_request(b"POST / HTTP/1.1\r\n\r\n", None, no_body=False)
    upstream.data_received(HEAD)
    await upstream.read_head()
    state, outcome = relay._IdleState(0.0), relay.StreamOutcome()
    upstream.relay_to(relay._Sink(StreamScanner(), client, state, outcome))
    for read in reads:
        upstream.data_received(b"".join(chunk(c) for c in read))
    upstream.data_received(b"0\r\n\r\n")
    assert await upstream.wait_relay() is True
    return client_transport.written


async def test_each_upstream_read_is_one_client_write_of_its_events() -> None:
    reads = [[event(1)], [event(2)], [event(3), event(4)], [event(5)]]
    written = await relayed(reads)
    # One write per read: the two events the upstream's third read held together stay
    # together, every other event goes alone.
    assert written == [chunk(b"".join(read)) for read in reads]


async def test_an_event_split_across_reads_is_passed_on_as_it_comes() -> None:
    whole = event(7)
    first, second = whole[:20], whole[20:]
    written = await relayed([[first], [second], [event(8)]])
    assert written == [chunk(first), chunk(second), chunk(event(8))]

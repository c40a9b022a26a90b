"""The upstream HTTP/1.1 connection: framing, split reads, keep-alive, errors."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.upstream.http1 import ConnectionClosed, Http1Connection, ProtocolError, ReadTimeout


class FakeTransport:
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

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def connect(read_timeout: float = 5.0) -> tuple[Http1Connection, FakeTransport]:
    connection = Http1Connection(read_timeout)
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.start_request(b"GET / HTTP/1.1\r\n\r\n", None, no_body=False)
    return connection, transport


async def body_of(connection: Http1Connection) -> bytes:
    parts = []
    while chunk := await connection.next_chunk():
        parts.append(chunk)
    return b"".join(parts)


def feed_split(connection: Http1Connection, data: bytes, cuts: list[int]) -> None:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(points):
        if end > start:
            connection.data_received(data[start:end])


CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n"
           b"7\r\ndata: 1\r\n10;ext=1\r\n\ndata: 2\n\ndata: \r\n0\r\nX-Trailer: y\r\n\r\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=25))
def test_chunked_body_survives_any_split(cuts: list[int]) -> None:
    async def scenario() -> None:
        connection, _ = connect()
        feed_split(connection, CHUNKED, cuts)
        status, headers = await connection.read_head()
        assert status == 200 and headers["Content-Type"] == "text/event-stream"
        assert await body_of(connection) == b"data: 1\ndata: 2\n\ndata: "
        assert connection.complete and connection.reusable

    asyncio.run(scenario())


async def test_content_length_and_keep_alive() -> None:
    connection, _ = connect()
    connection.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
    assert (await connection.read_head())[0] == 200
    connection.data_received(b"lo")
    assert await body_of(connection) == b"hello"
    assert connection.reusable


async def test_connection_close_header_and_http10_are_not_reused() -> None:
    connection, _ = connect()
    connection.data_received(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    await connection.read_head()
    assert connection.complete and not connection.reusable


async def test_body_until_close() -> None:
    connection, _ = connect()
    connection.data_received(b"HTTP/1.1 200 OK\r\n\r\npart one ")
    await connection.read_head()
    connection.data_received(b"part two")
    connection.connection_lost(None)
    assert await body_of(connection) == b"part one part two"
    assert not connection.reusable


async def test_interim_100_continue_is_skipped() -> None:
    connection, _ = connect()
    connection.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    status, _ = await connection.read_head()
    assert status == 204 and connection.complete


async def test_connection_lost_mid_body_is_an_error() -> None:
    connection, _ = connect()
    connection.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    await connection.read_head()
    assert await connection.next_chunk() == b"abc"
    connection.connection_lost(ConnectionResetError())
    with pytest.raises(ConnectionClosed):
        await connection.next_chunk()


@pytest.mark.parametrize("garbage", [
    b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
async def test_protocol_errors(garbage: bytes) -> None:
    connection, transport = connect()
    connection.data_received(garbage)
    with pytest.raises(ProtocolError):
        await connection.read_head()
        await body_of(connection)
    assert transport.closed


async def test_read_timeout_closes_the_connection() -> None:
    connection, transport = connect(read_timeout=0.05)
    with pytest.raises(ReadTimeout):
        await connection.read_head()
    assert transport.closed and not connection.reusable


async def test_backpressure_pauses_and_resumes_reading() -> None:
    connection, transport = connect()
    size = 6 * 1024 * 1024
    connection.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    await connection.read_head()
    for _ in range(6):
        connection.data_received(b"x" * (1024 * 1024))
    assert transport.paused
    total = 0
    while chunk := await connection.next_chunk():
        total += len(chunk)
    assert total == size and not transport.paused


async def test_body_read_timeout_counts_from_each_wait() -> None:
    # One timer serves every wait of a connection: pieces arriving in time never time out,
    # a wait that gets nothing does.
    connection, transport = connect(read_timeout=0.1)
    connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    await connection.read_head()
    loop = asyncio.get_running_loop()
    for piece in range(4):
        loop.call_later(0.06, connection.data_received, b"2\r\n%02d\r\n" % piece)
        assert await connection.next_chunk() == b"%02d" % piece
    with pytest.raises(ReadTimeout):
        await connection.next_chunk()
    assert transport.closed and not connection.reusable


async def test_whole_chunks_in_one_read_are_one_piece() -> None:
    connection, _ = connect()
    connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"3\r\nabc\r\n2;x=y\r\nde\r\n")
    await connection.read_head()
    assert await connection.next_chunk() == b"abcde"
    assert not connection.complete
    connection.data_received(b"0\r\n\r\n")
    assert await connection.next_chunk() == b""
    assert connection.complete and connection.reusable


# Relaying from the protocol callback (relay_to / wait_relay): what a stream's relay uses.
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_relay_hands_queued_then_arriving_pieces_to_the_sink_in_order() -> None:
    connection, _ = connect()
    connection.data_received(CHUNKED_HEAD + b"1\r\na\r\n")
    await connection.read_head()
    connection.data_received(b"1\r\nb\r\n")  # queued before the relay starts
    got: list[bytes] = []
    connection.relay_to(lambda piece: got.append(piece) is None)
    assert got == [b"a", b"b"]
    loop = asyncio.get_running_loop()
    loop.call_soon(connection.data_received, b"1\r\nc\r\n")
    loop.call_soon(connection.data_received, b"0\r\n\r\n")
    assert await connection.wait_relay() is True
    assert got == [b"a", b"b", b"c"] and connection.complete and connection.reusable


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=25))
async def test_relay_gives_the_same_body_for_any_split(cuts: list[int]) -> None:
    connection, _ = connect()
    connection.data_received(CHUNKED[:CHUNKED.index(b"\r\n\r\n") + 4])
    await connection.read_head()
    got: list[bytes] = []
    connection.relay_to(lambda piece: got.append(piece) is None)
    feed_split(connection, CHUNKED[CHUNKED.index(b"\r\n\r\n") + 4:], cuts)
    assert await connection.wait_relay() is True
    assert b"".join(got) == b"data: 1\ndata: 2\n\ndata: "


async def test_a_full_sink_pauses_reading_until_resumed() -> None:
    connection, transport = connect()
    connection.data_received(CHUNKED_HEAD)
    await connection.read_head()
    got: list[bytes] = []
    room = [1]

    def sink(piece: bytes) -> bool:
        got.append(piece)
        room[0] -= 1
        return room[0] > 0

    connection.relay_to(sink)
    connection.data_received(b"1\r\na\r\n")
    assert await connection.wait_relay() is False and transport.paused
    connection.data_received(b"1\r\nb\r\n")  # already on its way when reading paused
    assert got == [b"a"]
    room[0] = 5
    connection.resume_relay()
    assert got == [b"a", b"b"] and not transport.paused
    connection.data_received(b"0\r\n\r\n")
    assert await connection.wait_relay() is True


async def test_relay_read_timeout_counts_silence_not_the_whole_stream() -> None:
    connection, transport = connect(read_timeout=0.1)
    connection.data_received(CHUNKED_HEAD)
    await connection.read_head()
    got: list[bytes] = []
    connection.relay_to(lambda piece: got.append(piece) is None)
    loop = asyncio.get_running_loop()
    for step in range(1, 5):  # pieces every 60 ms: 240 ms in all, never 100 ms of silence
        loop.call_later(0.06 * step, connection.data_received, b"1\r\n%d\r\n" % step)
    with pytest.raises(ReadTimeout):
        await connection.wait_relay()
    assert got == [b"1", b"2", b"3", b"4"]
    assert transport.closed and not connection.reusable


async def test_a_sink_that_raises_ends_the_answer_with_its_error() -> None:
    connection, transport = connect()
    connection.data_received(CHUNKED_HEAD)
    await connection.read_head()

    def sink(piece: bytes) -> bool:
        raise ValueError("broken sink")

    connection.relay_to(sink)
    connection.data_received(b"1\r\na\r\n")
    with pytest.raises(ValueError, match="broken sink"):
        await connection.wait_relay()
    assert transport.closed and not connection.reusable


async def test_relay_sees_a_connection_lost_mid_stream() -> None:
    connection, _ = connect()
    connection.data_received(CHUNKED_HEAD)
    await connection.read_head()
    connection.relay_to(lambda piece: True)
    connection.data_received(b"1\r\na\r\n")
    connection.connection_lost(None)
    with pytest.raises(ConnectionClosed):
        await connection.wait_relay()


@pytest.mark.parametrize("size", [0, 100, 8 * 1024, 40_000, 64 * 1024 + 1])
def test_a_request_reaches_a_real_socket_whole_whatever_its_body_size(size: int) -> None:
    # On uvloop, as served: small bodies are joined to the head, middling ones leave with
    # it in one writev, large ones in a write of their own.
    head = b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)

    async def main() -> bytes:
        got = bytearray()
        done = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got.extend(await reader.readexactly(len(head) + size))
            done.set_result(None)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, connection = await asyncio.get_running_loop().create_connection(
            lambda: Http1Connection(5.0), "127.0.0.1", port)
        connection.start_request(head, body or None, no_body=False)
        await asyncio.wait_for(done, 10)
        server.close()
        return bytes(got)

    assert uvloop.run(main()) == head + body

"""The upstream pool against a raw loopback server: reuse, stale connections, bodies."""

from __future__ import annotations

import asyncio

from multidict import CIMultiDict

from proxy.errors import InvalidHeader
from proxy.upstream.pool import Upstream


class RawServer:
    """Answers each request with a fixed body; optionally closes right after answering."""

    def __init__(self, close_after_answer: bool) -> None:
        self.close_after_answer = close_after_answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                if self.close_after_answer:
                    await asyncio.sleep(0.05)
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def serve(raw: RawServer) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port


async def test_connections_are_reused() -> None:
    raw = RawServer(close_after_answer=False)
    server, port = await serve(raw)
    upstream = Upstream(f"http://127.0.0.1:{port}", 2, 2)
    await upstream.start()
    for _ in range(3):
        response = await upstream.send("POST", "/v1/chat/completions", "", CIMultiDict(), b"{}")
        assert await response.read() == b"ok"
    assert raw.connections == 1
    assert raw.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    await upstream.close()
    server.close()


async def test_a_connection_the_upstream_closed_while_idle_is_replaced() -> None:
    raw = RawServer(close_after_answer=True)
    server, port = await serve(raw)
    upstream = Upstream(f"http://127.0.0.1:{port}", 2, 2)
    await upstream.start()
    first = await upstream.send("POST", "/x", "a=1", CIMultiDict(), b"{}")
    assert await first.read() == b"ok"
    await asyncio.sleep(0.2)  # the server has closed the kept-alive connection by now
    second = await upstream.send("POST", "/x", "", CIMultiDict(), b"{}")
    assert await second.read() == b"ok"
    assert raw.connections == 2
    assert raw.requests[0].startswith(b"POST /v1/x?a=1 HTTP/1.1")
    await upstream.close()
    server.close()


async def test_streamed_request_body_uses_chunked_framing() -> None:
    raw = RawServer(close_after_answer=False)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        raw.requests.append(head + body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(f"http://127.0.0.1:{port}/base", 2, 2)
    await upstream.start()

    async def pieces() -> object:
        for piece in (b"hello ", b"", b"world"):
            yield piece

    response = await upstream.send("PUT", "/v1/files", "", CIMultiDict(), pieces())  # type: ignore[arg-type]
    assert await response.read() == b"ok"
    head, _, body = raw.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"PUT /base/files HTTP/1.1") and b"Transfer-Encoding: chunked" in head
    assert body == b"hello world"
    await upstream.close()
    server.close()


async def test_our_traceparent_goes_once_beside_the_headers_and_a_bad_one_is_refused() -> None:
    raw = RawServer(close_after_answer=False)
    server, port = await serve(raw)
    upstream = Upstream(f"http://127.0.0.1:{port}", 2, 2)
    await upstream.start()
    headers = CIMultiDict({"Authorization": "Bearer sk-x", "X-Other": "1"})
    sent = [f"00-{i:032x}-{i + 1:016x}-01" for i in (1, 2)]
    try:
        for traceparent in sent:
            response = await upstream.send("POST", "/v1/chat/completions", "", headers, b"{}",
                                           traceparent=traceparent)
            assert await response.read() == b"ok"
        for head, traceparent in zip(raw.requests, sent, strict=True):
            lines = head.split(b"\r\n\r\n")[0].split(b"\r\n")
            assert [line for line in lines if line.lower().startswith(b"traceparent:")] \
                == [f"traceparent: {traceparent}".encode()]
            assert b"Authorization: Bearer sk-x" in lines and b"X-Other: 1" in lines
        for bad in ("00-abc\r\nX-Injected: 1", "00-" + "0" * 32 + "-" + "1" * 16 + "-01 "):
            try:
                await upstream.send("POST", "/v1/chat/completions", "", headers, b"{}",
                                    traceparent=bad)
            except InvalidHeader:
                continue
            raise AssertionError(f"sent a traceparent of {bad!r}")
        assert len(raw.requests) == 2
    finally:
        await upstream.close()
        server.close()


async def test_a_client_gone_while_a_stream_is_relayed_is_not_an_upstream_failure() -> None:
    """The relay waits for the client's buffer (``drain``) between pieces; when the client
    is gone that wait raises the client's error, which must reach the relay as it is (the
    upstream is fine: no upstream error is counted, no error event is written)."""
    async def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n")
        await writer.drain()
        await asyncio.sleep(1.0)
        writer.write(b"0\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(streams, "127.0.0.1", 0)
    upstream = Upstream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", 2, 2)
    await upstream.start()
    response = await upstream.send("POST", "/x", "", CIMultiDict(), b"{}")

    async def client_gone() -> None:
        raise ConnectionResetError("Cannot write to closing transport")

    try:
        await response.pipe(lambda piece: False, client_gone)  # the client's buffer is full
    except ConnectionResetError:
        pass
    else:
        raise AssertionError("the client's error did not reach the relay")
    finally:
        response.close()
        await upstream.close()
        server.close()

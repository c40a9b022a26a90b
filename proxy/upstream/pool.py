"""The upstream side: where a client path goes, and the pooled client.

Upstream base URLs usually carry a path (``https://api.openai.com/v1``,
``https://openrouter.ai/api/v1``, ``http://vllm:8000/v1``) while OpenAI SDK users put ``/v1``
in their own ``base_url``. Both forms are accepted: a client path's leading ``/v1`` is replaced
by the upstream's base path, which defaults to ``/v1`` when the upstream URL has none.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from multidict import CIMultiDict

from proxy.errors import UpstreamTimeout, UpstreamUnavailable, unlinked
from proxy.upstream.headers import build_head
from proxy.upstream.http1 import ConnectionClosed, Http1Connection, ProtocolError, ReadTimeout


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    origin: str
    base_path: str

    @classmethod
    def parse(cls, url: str) -> UpstreamTarget:
        parts = urlsplit(url)
        base = parts.path.rstrip("/") or "/v1"
        return cls(origin=f"{parts.scheme}://{parts.netloc}", base_path=base)

    def path_for(self, client_path: str) -> str:
        """The upstream path for a client path (percent-encoded, dot segments refused)."""
        if client_path == "/v1" or client_path.startswith("/v1/"):
            client_path = client_path[3:]
        return self.base_path + client_path


# Opens one connection to the upstream for the protocol the factory makes.
Opener = Callable[[Callable[[], Http1Connection]], Awaitable[Http1Connection]]


class UpstreamResponse:
    """An upstream answer whose head has arrived; the body is read or iterated once."""

    def __init__(self, pool: Upstream, connection: Http1Connection, status: int,
                 headers: CIMultiDict[str]) -> None:
        self._pool = pool
        self._connection = connection
        self.status = status
        self.headers = headers

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool, or is closed when the read
        does not finish (an error, or the client left and the request was cancelled)."""
        parts: list[bytes] = []
        try:
            while chunk := await self.next_piece():
                parts.append(chunk)
        except BaseException:
            self.close()
            raise
        self.release()
        return b"".join(parts)

    async def read_up_to(self, limit: int) -> tuple[bytes, bool]:
        """At most a little over ``limit`` bytes of the body, and whether that was all of it.
        When it was not, the rest is still to be read with ``chunks`` (or dropped)."""
        parts: list[bytes] = []
        size = 0
        try:
            # Pieces awaited one by one, not through ``chunks``: an async generator made and
            # finalised per answer cost more than the read of a small one.
            while chunk := await self.next_piece():
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    return b"".join(parts), False
        except BaseException:
            self.close()
            raise
        self.release()
        return b"".join(parts), True

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive. Raises UpstreamTimeout / UpstreamUnavailable mid-way."""
        while chunk := await self.next_piece():
            yield chunk

    async def next_piece(self) -> bytes:
        """The next body piece, b"" at the end (the errors of ``chunks``)."""
        try:
            return await self._connection.next_chunk()
        except ReadTimeout as exc:
            raise UpstreamTimeout("the upstream went silent mid-answer") from unlinked(exc)
        except (ConnectionClosed, ProtocolError, OSError) as exc:
            raise UpstreamUnavailable(f"the upstream connection broke: {exc}") from unlinked(exc)

    async def pipe(self, sink: Callable[[bytes], bool],
                   drain: Callable[[], Awaitable[None]]) -> None:
        """The rest of the body handed to ``sink`` from the connection's own callback, each
        piece as it arrives; when ``sink`` returns False, reading waits for ``drain``."""
        connection = self._connection
        connection.relay_to(sink)
        while not await self._relayed():
            # The client's: a client gone raises its own error here, not the upstream's.
            await drain()
            connection.resume_relay()

    async def _relayed(self) -> bool:
        """``wait_relay`` with the upstream's failures as the answers they become."""
        try:
            return await self._connection.wait_relay()
        except ReadTimeout as exc:
            raise UpstreamTimeout("the upstream went silent mid-answer") from unlinked(exc)
        except (ConnectionClosed, ProtocolError, OSError) as exc:
            raise UpstreamUnavailable(f"the upstream connection broke: {exc}") from unlinked(exc)

    def close(self) -> None:
        """Drop the connection: used when the answer was not read to its end."""
        self._connection.close()

    def release(self) -> None:
        """Give the connection back to the pool if the answer was read to its end."""
        self._pool.give_back(self._connection)


class Replayed(UpstreamResponse):
    """An answer whose body was already read, offered again to a reader."""

    def __init__(self, original: UpstreamResponse, body: bytes) -> None:
        self.status = original.status
        self.headers = original.headers
        self._body = body

    async def read(self) -> bytes:
        return self._body

    async def read_up_to(self, limit: int) -> tuple[bytes, bool]:
        return self._body, True

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body

    async def next_piece(self) -> bytes:
        body, self._body = self._body, b""
        return body

    async def pipe(self, sink: Callable[[bytes], bool],
                   drain: Callable[[], Awaitable[None]]) -> None:
        body, self._body = self._body, b""
        if body and not sink(body):
            await drain()

    def close(self) -> None:
        return None

    def release(self) -> None:
        return None


class Upstream:
    """Keep-alive HTTP/1.1 connections to one upstream origin."""

    def __init__(self, url: str, connect_timeout: float, read_timeout: float, *,
                 idle_timeout: float = 30.0, max_idle: int = 256,
                 ca_file: str | None = None, opener: Opener | None = None) -> None:
        self.target = UpstreamTarget.parse(url)
        parts = urlsplit(url)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._host_header = parts.netloc.rsplit("@", 1)[-1]
        self._tls = parts.scheme == "https"
        self._ssl: ssl.SSLContext | None = None
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle_timeout = idle_timeout
        self._max_idle = max_idle
        self._idle: list[Http1Connection] = []
        self._ca_file = ca_file
        # The transport seam: how a connection to the upstream is opened (TCP, with TLS for
        # https, unless the application is built with another, as tests build it in-process).
        self._open: Opener = opener or self._open_tcp

    async def start(self) -> None:
        if self._tls:
            self._ssl = ssl.create_default_context(cafile=self._ca_file)

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def give_back(self, connection: Http1Connection) -> None:
        transport = connection.transport
        if (connection.complete and connection.reusable and transport is not None
                and not transport.is_closing() and len(self._idle) < self._max_idle):
            connection.idle_since = connection.loop.time()
            self._idle.append(connection)
        else:
            connection.close()

    async def send(
        self, method: str, client_path: str, query: str, headers: CIMultiDict[str],
        body: bytes | AsyncIterator[bytes] | None, *, traceparent: str | None = None,
    ) -> UpstreamResponse:
        """Send a request and wait for the response head (``traceparent``: tailfloor's own,
        sent beside ``headers``).

        ``client_path`` and ``query`` are raw (percent-encoded) as ``proxy.server.target`` made
        them; never aiohttp's decoded forms."""
        path = self.target.path_for(client_path)
        if query:
            path += "?" + query
        streamed = body is not None and not isinstance(body, bytes)
        if isinstance(body, bytes):
            framing = f"Content-Length: {len(body)}\r\n"
        elif streamed and "Content-Length" not in headers:
            framing = "Transfer-Encoding: chunked\r\n"
        elif body is None and method in ("POST", "PUT", "PATCH"):
            framing = "Content-Length: 0\r\n"
        else:
            framing = ""
        head = build_head(method, path, self._host_header, headers, framing,
                          traceparent=traceparent)
        fixed = body if isinstance(body, bytes) else None
        for attempt in (0, 1):
            connection, reused = await self._acquire()
            try:
                connection.start_request(head, fixed, no_body=method == "HEAD")
                if streamed:
                    assert body is not None and not isinstance(body, bytes)
                    await self._send_stream(connection, body, "Content-Length" not in headers)
                status, response_headers = await connection.read_head()
            except ConnectionClosed as exc:
                connection.close()
                unlinked(exc)  # the closed connection keeps it: its frames would keep the body
                # A kept-alive connection the upstream closed while idle: try once on a new one.
                if reused and attempt == 0 and not streamed and not connection.response_started:
                    continue
                raise UpstreamUnavailable(f"the upstream closed the connection: {exc}") from exc
            except ReadTimeout as exc:
                connection.close()
                raise UpstreamTimeout("the upstream did not answer in time") from unlinked(exc)
            except (ProtocolError, OSError) as exc:
                connection.close()
                raise UpstreamUnavailable(
                    f"the upstream answer was not HTTP: {exc}") from unlinked(exc)
            except BaseException:
                connection.close()
                raise
            return UpstreamResponse(self, connection, status, response_headers)
        raise AssertionError("unreachable")

    async def _acquire(self) -> tuple[Http1Connection, bool]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._idle:
            connection = self._idle.pop()
            transport = connection.transport
            if (transport is not None and not transport.is_closing()
                    and now - connection.idle_since < self._idle_timeout):
                return connection, True
            connection.close()
        try:
            protocol = await asyncio.wait_for(
                self._open(lambda: Http1Connection(self._read_timeout)), self._connect_timeout)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"connecting to the upstream took over "
                                  f"{self._connect_timeout:g} s") from unlinked(exc)
        except ssl.SSLError as exc:
            raise UpstreamUnavailable(
                f"TLS with the upstream failed ({exc.reason or exc}); if it uses a private "
                "CA, pass --upstream-ca FILE") from unlinked(exc)
        except OSError as exc:
            raise UpstreamUnavailable(
                f"cannot connect to the upstream: {exc.strerror or exc}") from unlinked(exc)
        return protocol, False

    async def _open_tcp(self, protocol: Callable[[], Http1Connection]) -> Http1Connection:
        _, connection = await asyncio.get_running_loop().create_connection(
            protocol, self._host, self._port, ssl=self._ssl,
            server_hostname=self._host if self._tls else None)
        return connection

    @staticmethod
    async def _send_stream(connection: Http1Connection, body: AsyncIterator[bytes],
                           chunked: bool) -> None:
        async for piece in body:
            if not piece:
                continue
            if chunked:
                await connection.write_body_chunk(b"%x\r\n" % len(piece), piece, b"\r\n")
            else:
                await connection.write_body_chunk(piece)
        if chunked:
            await connection.write_body_chunk(b"0\r\n\r\n")

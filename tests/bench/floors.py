"""The least a Python proxy on these parts can cost: four bare relays, none of tailfloor.

Each is a reverse proxy that forwards every request to the upstream as it came and relays the
answer chunk by chunk, and does nothing else (no parsing of the body, no metrics, no logs):

- ``aiohttp-own-client``: aiohttp's server (on uvloop, as tailfloor runs it) with tailfloor's
  own HTTP/1.1 upstream client (``proxy/upstream/pool.py``): the floor of tailfloor's
  request path as long as aiohttp is the server;
- ``aiohttp-server-own-client``: the same on aiohttp's low-level ``web.Server`` (no
  ``Application``, router or middleware chain);
- ``aiohttp-aiohttp-client``: the same server with aiohttp's ``ClientSession`` (a pooled
  connector, no timeouts per request): what the hand-written client is measured against;
- ``uvloop-raw``: no HTTP framework at all, an ``asyncio.Protocol`` on uvloop that splits
  the request head with bytes operations (Content-Length bodies only) and relays through
  tailfloor's client: what a hand-written server could reach.

They are measurement instruments, not proxies to deploy: no limits, no header hygiene.

Usage: python tests/bench/floors.py KIND PORT UPSTREAM_URL
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from aiohttp import ClientSession, TCPConnector, web
from multidict import CIMultiDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.upstream.pool import Upstream

KINDS = ("aiohttp-own-client", "aiohttp-server-own-client", "aiohttp-aiohttp-client",
         "uvloop-raw")
_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def _forwarded(headers: CIMultiDict[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP)


async def _own_client_app(upstream_url: str) -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", await _own_client_handler(upstream_url))
    return app


async def _own_client_handler(upstream_url: str
                              ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    upstream = Upstream(upstream_url, connect_timeout=5, read_timeout=60)
    await upstream.start()

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        answer = await upstream.send(request.method, request.raw_path.split("?", 1)[0],
                                     request.query_string, _forwarded(request.headers),
                                     body or None)
        kind = answer.headers.get("Content-Type", "")
        if not kind.startswith("text/event-stream"):
            return web.Response(body=await answer.read(), status=answer.status,
                                headers={"Content-Type": kind})
        response = web.StreamResponse(status=answer.status, headers={"Content-Type": kind})
        await response.prepare(request)
        async for piece in answer.chunks():
            await response.write(piece)
        answer.release()
        await response.write_eof()
        return response

    return handle


async def _aiohttp_client_app(upstream_url: str) -> web.Application:
    session = ClientSession(connector=TCPConnector(limit=0), auto_decompress=False)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.request(request.method, upstream_url.rstrip("/") + request.raw_path,
                                   headers=_forwarded(request.headers), data=body or None,
                                   skip_auto_headers=("User-Agent", "Accept-Encoding",
                                                      "Accept")) as answer:
            kind = answer.headers.get("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                return web.Response(body=await answer.read(), status=answer.status,
                                    headers={"Content-Type": kind})
            response = web.StreamResponse(status=answer.status,
                                          headers={"Content-Type": kind})
            await response.prepare(request)
            async for piece in answer.content.iter_any():
                await response.write(piece)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


class _RawRelay(asyncio.Protocol):
    """One client connection: requests one at a time, each relayed through the pool."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.add(name.strip().decode("latin-1"), value.strip().decode("latin-1"))
        length = int(headers.get("Content-Length", "0"))
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        method, target, _ = lines[0].decode("latin-1").split(" ", 2)
        path, _, query = target.partition("?")
        self.busy = True
        asyncio.get_running_loop().create_task(
            self._relay(method, path, query, _forwarded(headers), body))

    async def _relay(self, method: str, path: str, query: str, headers: CIMultiDict[str],
                     body: bytes) -> None:
        assert self.transport is not None
        answer = await self.upstream.send(method, path, query, headers, body or None)
        kind = answer.headers.get("Content-Type", "")
        head = (f"HTTP/1.1 {answer.status} OK\r\nContent-Type: {kind}\r\n").encode()
        if not kind.startswith("text/event-stream"):
            data = await answer.read()
            self.transport.write(head + b"Content-Length: %d\r\n\r\n%b" % (len(data), data))
        else:
            self.transport.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
            async for piece in answer.chunks():
                self.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            answer.release()
            self.transport.write(b"0\r\n\r\n")
        self.busy = False
        self._next()


async def _serve(kind: str, port: int, upstream_url: str) -> None:
    if kind == "uvloop-raw":
        upstream = Upstream(upstream_url, connect_timeout=5, read_timeout=60)
        await upstream.start()
        server = await asyncio.get_running_loop().create_server(
            lambda: _RawRelay(upstream), "127.0.0.1", port)
        async with server:
            await server.serve_forever()
        return
    if kind == "aiohttp-server-own-client":
        # aiohttp's low-level server: no Application, router or middleware chain.
        server = web.Server(await _own_client_handler(upstream_url), access_log=None)
        listening = await asyncio.get_running_loop().create_server(server, "127.0.0.1", port)
        async with listening:
            await listening.serve_forever()
        return
    app = await (_own_client_app(upstream_url) if kind == "aiohttp-own-client"
                 else _aiohttp_client_app(upstream_url))
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main() -> int:
    kind, port, upstream_url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if kind not in KINDS:
        print(f"KIND is one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    uvloop.run(_serve(kind, port, upstream_url))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

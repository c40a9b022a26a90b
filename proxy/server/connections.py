"""Client connections: at most ``cap`` at once, a clear refusal beyond it.

A connection over the cap is answered at once with an OpenAI-shaped 503 (``Retry-After``)
and closed, before any of it is parsed; the ones already open keep working, and the
process keeps file descriptors for its upstream connections, transcripts and probes.
``near_limit`` lets readiness turn false before the cap is reached, so a load balancer
sends new clients elsewhere first.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable

from aiohttp import web

from proxy.errors import error_body

__all__ = ["CappedSite", "default_cap"]

_NEAR = 0.9


def default_cap() -> int:
    """What the process's open-file limit allows, leaving room for everything else."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, min(10_000, soft - max(64, soft // 5)))


def _refusal() -> bytes:
    body = error_body("tailfloor has as many client connections as it may take; retry "
                      "shortly", "server_error", "too_many_connections")
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        write = getattr(transport, "write", None)  # uvloop's transports are not asyncio's
        if write is not None:
            write(_refusal())
        transport.close()


class CappedSite(web.TCPSite):
    """A TCP site whose server refuses connections beyond ``cap``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, cap: int,
                 refused: Callable[[], None], backlog: int = 1024) -> None:
        super().__init__(runner, host, port, backlog=backlog, reuse_address=True)
        self.cap = cap
        self._refused = refused
        self._runner_ref = runner

    def open_connections(self) -> int:
        server = self._runner_ref.server
        return len(server.connections) if server is not None else 0

    def near_limit(self) -> bool:
        return self.open_connections() >= _NEAR * self.cap

    def _factory(self) -> asyncio.Protocol:
        server = self._runner_ref.server
        assert server is not None
        if len(server.connections) >= self.cap:
            self._refused()
            return _Refused()
        return server()

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory, self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address)
        self._bound_port = self._server.sockets[0].getsockname()[1]

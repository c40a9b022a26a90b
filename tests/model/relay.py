"""A recording relay in front of the model server: what tailfloor sent the real upstream, and
the bytes the upstream answered, as the oracle of the real-model tests.

It forwards each request as it came and each answer chunk as it arrives (loopback only), so
the bytes it recorded are the bytes tailfloor received.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

_HOP = frozenset({"content-length", "transfer-encoding", "connection", "host",
                  "content-encoding"})


@dataclass
class Exchange:
    path: str
    body: bytes
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)  # the answer's, lower-cased names
    chunks: list[bytes] = field(default_factory=list)  # each kept before it is passed on

    @property
    def answer(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def is_summary(self) -> bool:
        """A call of tailfloor's summarizer (its system prompt names the job)."""
        messages = self.json().get("messages") or [{}]
        first = messages[0].get("content") if isinstance(messages[0], dict) else ""
        return isinstance(first, str) and "context summarization assistant" in first


class RecordingRelay:
    def __init__(self, target: str) -> None:
        self.target = target
        self.exchanges: list[Exchange] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def chats(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.endswith("/chat/completions")]

    async def _start(self) -> int:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return port

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        exchange = Exchange(request.path, body)
        self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, self.target + request.path_qs,
                                         data=body, headers=headers) as upstream:
            exchange.status = upstream.status
            exchange.headers = {k.lower(): v for k, v in upstream.headers.items()}
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                exchange.chunks.append(chunk)
                await response.write(chunk)
            await response.write_eof()
        return response

    def stop(self) -> None:
        async def close() -> None:
            await self._runner.cleanup()
            await self._session.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

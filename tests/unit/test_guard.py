"""The last guard: an unexpected exception in a handler becomes an OpenAI-shaped 500 with
the request id, counted; one after the answer's head went out closes the connection."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from proxy.logs import REQUEST_ID
from proxy.metrics import Metrics
from proxy.server.guard import last_guard, start_answer
from proxy.server.state import STATE_KEY


async def _broken(request: web.Request) -> web.StreamResponse:
    REQUEST_ID.set("req-42")
    raise RuntimeError("a bug")


async def _broken_midway(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await start_answer(response, request)
    await response.write(b"data: {}\n\n")
    raise RuntimeError("a bug after the head")


async def _exercise() -> tuple[int, dict[str, object], str, bool, float]:
    metrics = Metrics(CollectorRegistry())
    app = web.Application(middlewares=[last_guard])
    app[STATE_KEY] = SimpleNamespace(metrics=metrics)  # type: ignore[assignment]
    app.router.add_get("/broken", _broken)
    app.router.add_get("/midway", _broken_midway)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        async with session.get(server.make_url("/broken")) as answer:
            status, body = answer.status, orjson.loads(await answer.read())
            request_id = answer.headers["x-tailfloor-request-id"]
        cut = False
        try:
            async with session.get(server.make_url("/midway")) as answer:
                await answer.read()
        except aiohttp.ClientPayloadError:
            cut = True
    count = metrics.registry.get_sample_value("tailfloor_internal_errors_total") or 0.0
    return status, body, request_id, cut, count


def test_an_unexpected_error_is_an_openai_shaped_500_and_a_late_one_cuts_the_answer() -> None:
    status, body, request_id, cut, count = asyncio.run(_exercise())
    assert status == 500
    assert body["error"]["code"] == "internal_error"  # type: ignore[index]
    assert body["error"]["type"] == "server_error"  # type: ignore[index]
    assert request_id == "req-42" and "req-42" in body["error"]["message"]  # type: ignore[index]
    assert cut, "the client was told the answer ended normally"
    assert count == 2

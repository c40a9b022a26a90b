"""Every route but the chat route: forwarded as is, bodies streamed both ways."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.errors import BodyTimeout, BodyTooLarge, ProxyError, Rejected, ShuttingDown
from proxy.floor.decision import public_verdict
from proxy.server.accounting import Accounting
from proxy.server.answers import error_response
from proxy.server.body import body_encoding, decodable, decode_stream
from proxy.server.draining import BodyReads
from proxy.server.guard import start_answer
from proxy.server.state import STATE_KEY, ProxyState
from proxy.server.target import Target
from proxy.upstream.headers import forward_headers, response_headers
from proxy.values import frozen_value
from proxy.wire.dialect import Dialect

__all__ = ["BodyPace", "forward", "limited", "passthrough", "route_label"]

_ROUTE_LABELS = {
    "/chat/completions": "chat_completions", "/models": "models", "/embeddings": "embeddings",
    "/responses": "responses", "/completions": "completions", "/moderations": "moderations",
}


def route_label(client_path: str) -> str:
    path = client_path[3:] if client_path.startswith("/v1/") else client_path
    if path.startswith("/models"):
        return "models"
    return _ROUTE_LABELS.get(path, "other")


async def passthrough(request: web.Request, target: Target) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    acct = Accounting(state, request, route_label(target.path))
    try:
        response, gone = await forward(state, request, target, acct)
        return acct.answer(response, gone=gone)
    except (asyncio.CancelledError, ConnectionError):
        acct.gone = True
        raise
    finally:
        acct.finish()


@frozen_value
class BodyPace:
    """How long a body may wait for its client: ``grace`` seconds, and a second more for
    every ``rate`` bytes received. The time left grows with what arrives, so a client that
    sends a few bytes and stops is cut off after the grace, however long the body it
    declared (or the largest one allowed) would take."""

    grace: float
    rate: int

    def allowed(self, received: int) -> float:
        return self.grace + received / self.rate


async def limited(pieces: AsyncIterator[bytes], limit: int, pace: BodyPace, reads: BodyReads
                  ) -> AsyncIterator[bytes]:
    """The body as it streams in, cut off (and the upstream request with it) past ``limit``
    bytes or when it falls behind ``pace`` (a body slower than --min-body-rate); once the
    drain began, by the drain's body deadline (``ShuttingDown``: 503, so that it is answered
    before the process stops). Only the time spent waiting for the client's next piece
    counts, not what its consumer (the route, the upstream) takes between two pieces."""
    source = aiter(pieces)
    loop = asyncio.get_running_loop()
    seen, waited = 0, 0.0
    while True:
        began = loop.time()
        try:
            # The timer covers the wait for the next piece only, not the yield: the consumer
            # (the upstream write) is not cut off by it.
            async with asyncio.timeout_at(began + pace.allowed(seen) - waited) as timer:
                with reads.reading(timer):
                    piece = await anext(source)
        except StopAsyncIteration:
            return
        except TimeoutError as exc:
            if reads.draining:
                raise ShuttingDown("tailfloor is shutting down; retry on another "
                                   "instance") from exc
            raise BodyTimeout(f"the request body arrived slower than {pace.rate} "
                              "bytes/s") from exc
        waited += loop.time() - began
        seen += len(piece)
        if seen > limit:
            raise BodyTooLarge(f"request body is over the {limit}-byte limit")
        yield piece


def _request_body(state: ProxyState, request: web.Request, body: AsyncIterator[bytes] | None
                  ) -> tuple[CIMultiDict[str], Any]:
    """The headers and the body to send upstream: ``body`` when the route read part of it
    already (decoded, sent chunked), else the client's as it streams in (decoded too)."""
    encoding = body_encoding(request.headers) if request.body_exists else None
    decoded = decodable(encoding)
    headers = forward_headers(request.headers, decoded_body=decoded)
    if body is not None:
        return headers, body
    if not request.body_exists:
        return headers, None
    settings = state.settings
    limit, length = settings.max_body_bytes, request.content_length
    data = limited(request.content.iter_any(), limit,
                   BodyPace(settings.idle_timeout, settings.min_body_rate), state.body_reads)
    if decoded:
        assert encoding is not None
        return headers, decode_stream(data, encoding, limit)  # chunked: its length is unknown
    if length is not None:
        headers["Content-Length"] = str(length)
    return headers, data


async def forward(state: ProxyState, request: web.Request, target: Target,
                  acct: Accounting, *, verdict: str | None = None,
                  body: AsyncIterator[bytes] | None = None, dialect: Dialect | None = None
                  ) -> tuple[web.StreamResponse, bool]:
    """The upstream's answer relayed; and whether a write found the client gone. ``verdict``:
    the ``x-tailfloor`` value of a chat request forwarded unread; ``body``: its body, decoded,
    when the route began reading it (sent chunked); ``dialect``: the shape of errors."""
    length = request.content_length
    limit = state.settings.max_body_bytes
    if length is not None and length > limit:
        too_large = BodyTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
        state.record.rejected(too_large.reason)
        return error_response(too_large, acct.request_id, dialect), False
    headers, data = _request_body(state, request, body)
    overhead = time.perf_counter() - acct.started
    try:
        upstream = await state.upstream.send(request.method, target.path, target.query,
                                             headers, data)
    except Rejected as exc:  # a body past the limit or not decodable, a bad header
        state.record.rejected(exc.reason)
        return error_response(exc, acct.request_id, dialect), False
    except ProxyError as exc:
        state.record.upstream_error(exc.reason)
        return error_response(exc, acct.request_id, dialect), False
    before = time.perf_counter()
    out_headers = response_headers(upstream.headers, keep_length=True)
    out_headers["x-tailfloor-request-id"] = acct.request_id
    mode = state.settings.tailfloor_header
    if verdict is not None and mode != "off":
        out_headers["x-tailfloor"] = verdict if mode == "detailed" else public_verdict(verdict)
    response = web.StreamResponse(status=upstream.status, headers=out_headers)
    await start_answer(response, request, upstream.close)
    overhead += time.perf_counter() - before
    try:
        async for chunk in upstream.chunks():
            await response.write(chunk)
    except ConnectionError:
        upstream.close()  # the client is gone; nothing more to send
        return response, True
    except ProxyError as exc:
        upstream.close()
        state.record.upstream_error("mid_stream", exc)
        if request.transport is not None:
            request.transport.close()  # the body is cut short: the client must see an error
        return response, False
    except BaseException:
        upstream.close()
        raise
    upstream.release()
    await response.write_eof()
    state.record.overhead(acct.route, overhead)
    return response, False

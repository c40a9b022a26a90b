"""HTTP handlers: the chat route's entry, transparent passthrough, health and metrics.

The chat handler parses the body once, hands the request to ``ChatExchange`` (proxy/exchange.py,
the request path itself) and records the request's metrics once, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from proxy.errors import (
    BadRequest,
    BodyTooLarge,
    InvalidHeader,
    ProxyError,
    Rejected,
    UnsupportedEncoding,
    error_body,
)
from proxy.logs import REQUEST_ID
from proxy.metrics import CONTENT_TYPE_LATEST
from proxy.model import ChatRequest
from proxy.server.body import body_encoding, decodable, decode, decode_stream
from proxy.server.exchange import CLIENT_GONE, JSON, ChatExchange, error_response
from proxy.server.state import STATE_KEY, ProxyState
from proxy.server.target import Target, parse_target, route_path
from proxy.upstream.pool import forward_headers, response_headers

ACCESS_LOG = logging.getLogger("tailfloor.access")
# nginx's convention for "the client closed the connection before the answer was complete".
CLIENT_CLOSED = 499
CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
# Compressed chat bodies above this size are decoded in a worker thread.
_DECODE_INLINE = 256 * 1024
_ROUTE_LABELS = {
    "/chat/completions": "chat_completions", "/models": "models", "/embeddings": "embeddings",
    "/responses": "responses", "/completions": "completions", "/moderations": "moderations",
}


def route_label(client_path: str) -> str:
    path = client_path[3:] if client_path.startswith("/v1/") else client_path
    if path.startswith("/models"):
        return "models"
    return _ROUTE_LABELS.get(path, "other")


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body as the chat route reads it: decoded, within ``limit`` both ways."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(
            f"request body of {request.content_length} bytes is over the {limit}-byte limit")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"request body is over the {limit}-byte limit") from exc
    encoding = body_encoding(request.headers)
    if encoding is None:
        return raw
    if not decodable(encoding):
        raise UnsupportedEncoding(f"chat request bodies in {encoding!r} are not supported; "
                                  "send gzip, deflate or an uncompressed body")
    if len(raw) > _DECODE_INLINE:
        return await asyncio.to_thread(decode, raw, encoding, limit)
    return decode(raw, encoding, limit)


def _request_id(state: ProxyState, request: web.Request) -> str:
    """The client's x-request-id, or ours; every log line of the request carries it."""
    request_id = request.headers.get("x-request-id") or state.next_request_id()
    REQUEST_ID.set(request_id)
    return request_id


async def route(request: web.Request) -> web.StreamResponse:
    """Every request that is not one of tailfloor's own routes: the chat route or the
    passthrough, chosen from the raw target (never aiohttp's decoded path)."""
    try:
        target = parse_target(request.raw_path)
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # Any other transfer coding would be dropped silently by the parser.
            raise InvalidHeader("only the chunked transfer coding is accepted")
    except Rejected as exc:
        state = request.app[STATE_KEY]
        request_id = _request_id(state, request)
        state.metrics.rejected.labels(reason=exc.reason).inc()
        state.metrics.requests_by("other", "none", str(exc.status)).inc()
        return error_response(exc, request_id)
    if request.method == "POST" and route_path(target.path) in CHAT_PATHS:
        return await chat_completions(request, target)
    return await passthrough(request, target)


async def not_here(request: web.Request) -> web.Response:
    """``/tailfloor/*`` on the proxy port: introspection lives on the admin listener only."""
    return web.Response(
        body=error_body("tailfloor's introspection routes are served on the admin listener "
                        "(--admin-listen)", "invalid_request_error", "not_found"),
        status=404, content_type=JSON)


async def chat_completions(request: web.Request, target: Target) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    request_id = _request_id(state, request)
    if state.draining:
        return _draining(request_id)
    state.metrics.in_flight.inc()
    model = ""
    code = 500
    try:
        try:
            raw = await _read_body(request, state.settings.max_body_bytes)
            body = _parse_json_object(raw)
        except ProxyError as exc:
            state.metrics.rejected.labels(reason=exc.reason).inc()
            code = exc.status
            return error_response(exc, request_id)
        chat = ChatRequest.parse(raw, body, target.agent)
        model = chat.model
        exchange = ChatExchange(state, request, target, chat, request_id=request_id,
                                started=started)
        response = await exchange.run()
        code = response.status
        if response.get(CLIENT_GONE):
            code = CLIENT_CLOSED
            state.metrics.client_disconnects.inc()
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            ACCESS_LOG.info("%s %s %d %s", request.method, request.path, code, exchange.verdict,
                            extra={"status": code, "model": model, "verdict": exchange.verdict,
                                   "ms": round((time.perf_counter() - started) * 1e3, 3)})
        return response
    except (asyncio.CancelledError, ConnectionError):
        # Cancelled while waiting, or a write found the client gone: either way it left.
        code = CLIENT_CLOSED
        state.metrics.client_disconnects.inc()
        raise
    finally:
        state.metrics.in_flight.dec()
        label = state.metrics.model_label(model)
        state.metrics.requests_by("chat_completions", label, str(code)).inc()
        state.metrics.duration_by("chat_completions", label).observe(time.perf_counter() - started)


def _parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


async def passthrough(request: web.Request, target: Target) -> web.StreamResponse:
    """Any other method and path: forwarded as is, bodies streamed both ways."""
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    request_id = _request_id(state, request)
    route = route_label(target.path)
    if state.draining:
        return _draining(request_id)
    state.metrics.in_flight.inc()
    response: web.StreamResponse | None = None
    disconnected = False
    try:
        response = await _forward(state, request, target, route, request_id=request_id,
                                  started=started)
        return response
    except (asyncio.CancelledError, ConnectionError):
        disconnected = True
        state.metrics.client_disconnects.inc()
        raise
    finally:
        state.metrics.in_flight.dec()
        code = str(response.status) if response is not None else "500"
        if response is not None and response.get(CLIENT_GONE):
            disconnected = True
            state.metrics.client_disconnects.inc()
        if disconnected:
            code = str(CLIENT_CLOSED)
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            ACCESS_LOG.info("%s %s %s", request.method, request.path, code,
                            extra={"status": int(code), "route": route,
                                   "ms": round((time.perf_counter() - started) * 1e3, 3)})
        state.metrics.requests_by(route, "none", code).inc()
        state.metrics.duration_by(route, "none").observe(time.perf_counter() - started)


async def _limited(pieces: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The body as it streams in, cut off (and the upstream request with it) past ``limit``."""
    seen = 0
    async for piece in pieces:
        seen += len(piece)
        if seen > limit:
            raise BodyTooLarge(f"request body is over the {limit}-byte limit")
        yield piece


async def _forward(state: ProxyState, request: web.Request, target: Target, route: str, *,
                   request_id: str, started: float) -> web.StreamResponse:
    length = request.content_length
    limit = state.settings.max_body_bytes
    if length is not None and length > limit:
        too_large = BodyTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
        state.metrics.rejected.labels(reason=too_large.reason).inc()
        return error_response(too_large, request_id)
    encoding = body_encoding(request.headers) if request.body_exists else None
    decoded = decodable(encoding)
    headers = forward_headers(request.headers, decoded_body=decoded)
    data: Any = None
    if request.body_exists:
        data = _limited(request.content.iter_any(), limit)
        if decoded:
            assert encoding is not None
            data = decode_stream(data, encoding, limit)  # sent chunked: its length is unknown
        elif length is not None:
            headers["Content-Length"] = str(length)
    overhead = time.perf_counter() - started
    try:
        upstream = await state.upstream.send(request.method, target.path, target.query,
                                             headers, data)
    except Rejected as exc:  # a body past the limit or not decodable, a bad header
        state.metrics.rejected.labels(reason=exc.reason).inc()
        return error_response(exc, request_id)
    except ProxyError as exc:
        state.metrics.upstream_errors.labels(kind=exc.reason).inc()
        return error_response(exc, request_id)
    before = time.perf_counter()
    out_headers = response_headers(upstream.headers, keep_length=True)
    out_headers["x-tailfloor-request-id"] = request_id
    response = web.StreamResponse(status=upstream.status, headers=out_headers)
    await response.prepare(request)
    overhead += time.perf_counter() - before
    try:
        async for chunk in upstream.chunks():
            await response.write(chunk)
    except ConnectionError:
        upstream.close()  # the client is gone; nothing more to send
        response[CLIENT_GONE] = True
        return response
    except ProxyError as exc:
        upstream.close()
        state.metrics.upstream_errors.labels(kind="mid_stream").inc()
        state.log.warning("upstream body broke mid-way: %s", exc.message)
        if request.transport is not None:
            request.transport.close()  # the body is cut short: the client must see an error
        return response
    except BaseException:
        upstream.close()
        raise
    upstream.release()
    await response.write_eof()
    state.metrics.overhead_by(route).observe(overhead)
    return response


def _draining(request_id: str) -> web.Response:
    return web.Response(
        body=error_body("tailfloor is shutting down; retry on another instance",
                        "server_error", "shutting_down"),
        status=503, content_type=JSON,
        headers={"Connection": "close", "x-tailfloor-request-id": request_id})


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if state.draining or not state.ready:
        return web.Response(text="not ready\n", status=503)
    return web.Response(text="ready\n")


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(body=state.metrics.exposition(),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def sessions(request: web.Request) -> web.Response:
    """Metadata of every tracked session (never message content)."""
    service = request.app[STATE_KEY].transcripts
    listing = service.sessions_summary() if service is not None else []
    return web.Response(body=orjson.dumps({"sessions": listing}), content_type=JSON)

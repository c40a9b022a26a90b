"""HTTP handlers: the chat route, transparent passthrough, health and metrics.

The chat handler reads top to bottom as the request path: parse once, prepare the upstream
body, send, relay, record metrics once from the values the stages returned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.errors import BadRequest, BodyTooLarge, ProxyError, error_body, to_response_parts
from proxy.logs import REQUEST_ID
from proxy.metrics import CONTENT_TYPE_LATEST
from proxy.model import (
    ChatRequest,
    ErrorReply,
    Outcome,
    Rewrite,
    UpstreamAnswer,
    Usage,
    UsageAdjustment,
    with_stream_usage,
)
from proxy.relay import relay_stream
from proxy.sse import StreamScanner, finish_reason_of, read_body_usage
from proxy.state import STATE_KEY, ProxyState
from proxy.upstream import Replayed as _Replayed
from proxy.upstream import UpstreamResponse, forward_headers, response_headers

ACCESS_LOG = logging.getLogger("tailfloor.access")
JSON = "application/json"
# nginx's convention for "the client closed the connection before the answer was complete".
CLIENT_CLOSED = 499
_ROUTE_LABELS = {
    "/chat/completions": "chat_completions", "/models": "models", "/embeddings": "embeddings",
    "/responses": "responses", "/completions": "completions", "/moderations": "moderations",
}


def route_label(client_path: str) -> str:
    path = client_path[3:] if client_path.startswith("/v1/") else client_path
    if path.startswith("/models"):
        return "models"
    return _ROUTE_LABELS.get(path, "other")


def client_path(request: web.Request) -> str:
    """The path as the upstream should see it: without the /agents/<id> prefix."""
    path = request.raw_path.split("?", 1)[0]
    if "agent" not in request.match_info:
        return path
    rest = path.split("/", 3)
    return "/" + rest[3] if len(rest) > 3 else "/"


def _error(exc: ProxyError, request_id: str) -> web.Response:
    status, body = to_response_parts(exc)
    return web.Response(body=body, status=status, content_type=JSON,
                        headers={"x-tailfloor-request-id": request_id})


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(
            f"request body of {request.content_length} bytes is over the {limit}-byte limit")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"request body is over the {limit}-byte limit") from exc


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    request_id = request.headers.get("x-request-id") or state.next_request_id()
    REQUEST_ID.set(request_id)
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
            return _error(exc, request_id)
        chat = ChatRequest.parse(raw, body, request.match_info.get("agent"))
        model = chat.model
        exchange = _ChatExchange(state, request, chat, request_id, started)
        response = await exchange.run()
        code = response.status
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


class _CoalescedStream(web.StreamResponse):
    """Sends the response head together with the first event (one write, one TCP segment
    less before the first token); an idle stream's first keep-alive flushes it too."""

    _send_headers_immediately = False


class _ChatExchange:
    """One chat request from the moment it is parsed until the client has its answer."""

    def __init__(self, state: ProxyState, request: web.Request, chat: ChatRequest,
                 request_id: str, started: float) -> None:
        self.state = state
        self.request = request
        self.chat = chat
        self.request_id = request_id
        self.started = started
        self.proxy_seconds = 0.0
        # What tailfloor did to the request, for the x-tailfloor header and the access log.
        self.verdict = "none"
        self.adjust: UsageAdjustment | None = None

    async def run(self) -> web.StreamResponse:
        state, chat, headers = self.state, self.chat, self.request.headers
        rewrite = state.rewriter.rewrite(chat, headers)
        rewrite = await state.recovery.before_send(chat, rewrite, headers)
        self.proxy_seconds += time.perf_counter() - self.started
        attempt = 0
        while True:
            self.verdict, self.adjust = rewrite.verdict, rewrite.adjust
            try:
                upstream, hide_usage = await self._send(rewrite)
                if upstream.status < 400:
                    break
                answer = await upstream.read()
            except ProxyError as exc:
                state.metrics.upstream_errors.labels(kind=exc.reason).inc()
                state.log.warning("upstream failed before answering: %s", exc.message)
                return _error(exc, self.request_id)
            decided = time.perf_counter()
            next_step = await state.recovery.on_error(
                chat, rewrite,
                UpstreamAnswer(upstream.status, upstream.headers.get("Content-Type"), answer),
                headers, attempt=attempt)
            self.proxy_seconds += time.perf_counter() - decided
            if isinstance(next_step, Rewrite) and attempt == 0:
                rewrite, attempt = next_step, 1
                continue
            if isinstance(next_step, ErrorReply):
                return web.Response(body=next_step.body, status=next_step.status,
                                    content_type=JSON,
                                    headers={"x-tailfloor-request-id": self.request_id})
            return self._finish_plain(upstream, answer, rewrite)
        is_sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
        if not is_sse:
            try:
                answer = await upstream.read()
            except ProxyError as exc:
                state.metrics.upstream_errors.labels(kind=exc.reason).inc()
                return _error(exc, self.request_id)
            return self._finish_plain(upstream, answer, rewrite)
        return await self._finish_stream(
            upstream, StreamScanner(hide_usage=hide_usage, adjust=self.adjust), rewrite)

    async def _send(self, rewrite: Rewrite) -> tuple[UpstreamResponse, bool]:
        """Send the body upstream; returns the response and whether usage is to be hidden."""
        state, chat = self.state, self.chat
        hide_usage = (chat.stream and not chat.include_usage
                      and state.settings.inject_stream_usage and not state.stream_options_rejected)
        body = with_stream_usage(rewrite.body, chat.body) if hide_usage else rewrite.body
        headers = forward_headers(self.request.headers, identity_encoding=True)
        path = client_path(self.request)
        query = self.request.query_string
        upstream = await state.upstream.send("POST", path, query, headers, body)
        if hide_usage and upstream.status == 400:
            answer = await upstream.read()
            if b"stream_options" not in answer:
                return _Replayed(upstream, answer), False
            # This upstream does not know stream_options: remember, and send as the client did.
            state.stream_options_rejected = True
            state.metrics.upstream_errors.labels(kind="stream_options_rejected").inc()
            upstream = await state.upstream.send("POST", path, query, headers, rewrite.body)
            hide_usage = False
        return upstream, hide_usage

    def _client_headers(self, upstream: UpstreamResponse) -> CIMultiDict[str]:
        headers = response_headers(upstream.headers, keep_length=False)
        headers["x-tailfloor-request-id"] = self.request_id
        if self.state.settings.tailfloor_header:
            headers["x-tailfloor"] = self.verdict
        return headers

    def _finish_plain(self, upstream: UpstreamResponse, answer: bytes,
                      rewrite: Rewrite) -> web.Response:
        after = time.perf_counter()
        if upstream.status == 200:
            usage, answer = read_body_usage(answer, self.adjust)
            self._count_usage(usage)
            self.state.recovery.after_answer(self.chat, rewrite, Outcome(
                upstream.status, usage, finish_reason_of(answer), None))
        headers = self._client_headers(upstream)
        response = web.Response(body=answer, status=upstream.status, headers=headers)
        self._observe_overhead(time.perf_counter() - after)
        return response

    async def _finish_stream(self, upstream: UpstreamResponse, scanner: StreamScanner,
                             rewrite: Rewrite) -> web.StreamResponse:
        state = self.state
        before = time.perf_counter()
        headers = self._client_headers(upstream)
        response = _CoalescedStream(status=upstream.status, headers=headers)
        await response.prepare(self.request)
        prepared = time.perf_counter() - before
        try:
            outcome = await relay_stream(self.request, response, upstream, scanner,
                                         state.settings.keepalive_interval)
        except BaseException:
            upstream.close()
            raise
        if outcome.keepalives:
            state.metrics.keepalives.inc(outcome.keepalives)
        if outcome.upstream_error is not None:
            upstream.close()
            kind = "timeout" if outcome.upstream_error.reason == "timeout" else "mid_stream"
            state.metrics.upstream_errors.labels(kind=kind).inc()
            state.log.warning("upstream stream broke: %s", outcome.upstream_error.message)
        else:
            upstream.release()
        if outcome.first_chunk_at is not None:
            state.metrics.ttft_by(state.metrics.model_label(self.chat.model)).observe(
                outcome.first_chunk_at - self.started)
        self._count_usage(scanner.usage)
        state.recovery.after_answer(self.chat, rewrite, Outcome(
            upstream.status, scanner.usage, scanner.finish_reason, scanner.error))
        self._observe_overhead(prepared + outcome.proxy_seconds)
        return response

    def _count_usage(self, usage: Usage | None) -> None:
        metrics = self.state.metrics
        if usage is None:
            metrics.usage_missing.labels(route="chat_completions").inc()
            return
        model = metrics.model_label(self.chat.model)
        agent = metrics.agent_label(self.chat.agent_id or "none")
        for kind, value in (("input", usage.input_tokens), ("output", usage.completion_tokens),
                            ("cached_input", usage.cached_tokens),
                            ("reasoning", usage.reasoning_tokens)):
            if value:
                metrics.tokens_by(model, agent, kind).inc(value)

    def _observe_overhead(self, extra: float) -> None:
        self.state.metrics.overhead_by("chat_completions").observe(self.proxy_seconds + extra)


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other method and path: forwarded as is, bodies streamed both ways."""
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    request_id = request.headers.get("x-request-id") or state.next_request_id()
    REQUEST_ID.set(request_id)
    path = client_path(request)
    route = route_label(path)
    if state.draining:
        return _draining(request_id)
    state.metrics.in_flight.inc()
    response: web.StreamResponse | None = None
    disconnected = False
    try:
        response = await _forward(state, request, path, route, request_id=request_id,
                                  started=started)
        return response
    except (asyncio.CancelledError, ConnectionError):
        disconnected = True
        state.metrics.client_disconnects.inc()
        raise
    finally:
        state.metrics.in_flight.dec()
        code = str(response.status) if response is not None else "500"
        if disconnected:
            code = str(CLIENT_CLOSED)
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            ACCESS_LOG.info("%s %s %s", request.method, request.path, code,
                            extra={"status": int(code), "route": route,
                                   "ms": round((time.perf_counter() - started) * 1e3, 3)})
        state.metrics.requests_by(route, "none", code).inc()
        state.metrics.duration_by(route, "none").observe(time.perf_counter() - started)


async def _forward(state: ProxyState, request: web.Request, path: str, route: str, *,
                   request_id: str, started: float) -> web.StreamResponse:
    length = request.content_length
    limit = state.settings.max_body_bytes
    if length is not None and length > limit:
        too_large = BodyTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
        state.metrics.rejected.labels(reason=too_large.reason).inc()
        return _error(too_large, request_id)
    headers = forward_headers(request.headers)
    data: Any = None
    if request.body_exists:
        data = request.content.iter_any()
        if length is not None:
            headers["Content-Length"] = str(length)
    overhead = time.perf_counter() - started
    try:
        upstream = await state.upstream.send(request.method, path, request.query_string,
                                             headers, data)
    except ProxyError as exc:
        state.metrics.upstream_errors.labels(kind=exc.reason).inc()
        return _error(exc, request_id)
    before = time.perf_counter()
    out_headers = response_headers(upstream.headers, keep_length=True)
    out_headers["x-tailfloor-request-id"] = request_id
    response = web.StreamResponse(status=upstream.status, headers=out_headers)
    await response.prepare(request)
    overhead += time.perf_counter() - before
    try:
        async for chunk in upstream.chunks():
            await response.write(chunk)
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

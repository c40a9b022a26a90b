"""HTTP handlers: the dispatch of every request, the chat route's entry, health and metrics.

``route`` parses the raw request target once (``target.py``) and picks the chat route or the
passthrough from it (never from aiohttp's decoded path). The chat handler reads and parses
the body once and hands the request to ``ChatExchange`` (``exchange.py``, the request path
itself); ``Accounting`` does the bookkeeping of both routes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from proxy.chat import ChatRequest, is_large_body
from proxy.errors import (
    BadRequest,
    BodyTimeout,
    BodyTooLarge,
    Busy,
    InvalidHeader,
    Rejected,
    ShuttingDown,
    UnsupportedEncoding,
    error_body,
)
from proxy.floor.decision import pass_through
from proxy.metrics import CONTENT_TYPE_LATEST
from proxy.server.accounting import Accounting, refused, request_id
from proxy.server.answers import JSON, error_response
from proxy.server.body import body_encoding, decodable, decode
from proxy.server.draining import BodyReads
from proxy.server.exchange import ChatExchange
from proxy.server.held_bodies import Hold
from proxy.server.passthrough import forward, passthrough
from proxy.server.state import STATE_KEY, ProxyState
from proxy.server.target import Target, parse_target, route_path
from proxy.wire.anthropic import MESSAGES
from proxy.wire.dialect import Dialect
from proxy.wire.responses import RESPONSES

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
# The other two dialects the agents speak, translated for the stages (proxy/wire/dialect.py).
DIALECT_PATHS: dict[str, Dialect] = {"/v1/responses": RESPONSES, "/responses": RESPONSES,
                                     "/v1/messages": MESSAGES, "/messages": MESSAGES}
# A body above either bound is not parsed: parsing is one call that holds the interpreter,
# and so every other request, for ~8 ms per 50,000 JSON objects or ~13 ms per 8 MB. It is
# forwarded as it came, counted (x-tailfloor: none; reason=too_large).
MAX_OBJECTS = 50_000
MAX_PARSED_BYTES = 8 * 1024 * 1024
# Compressed chat bodies above this size are decoded in a worker thread.
_DECODE_INLINE = 256 * 1024


async def route(request: web.Request) -> web.StreamResponse:
    """Every request that is not one of tailfloor's own routes."""
    state = request.app[STATE_KEY]
    try:
        target = parse_target(request.raw_path)
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # Any other transfer coding would be dropped silently by the parser.
            raise InvalidHeader("only the chunked transfer coding is accepted")
    except Rejected as exc:
        state.record.rejected(exc.reason)
        state.metrics.requests_by("other", "none", str(exc.status)).inc()
        rid = request_id(state, request)
        refused(request, exc.status, exc.reason, rid)
        return error_response(exc, rid, _shape(request))
    if state.draining:
        return _draining(request_id(state, request), _shape(request))
    if request.method == "POST":
        path = route_path(target.path)
        if path in CHAT_PATHS:
            return await chat_completions(request, target)
        dialect = DIALECT_PATHS.get(path)
        if dialect is not None:
            return await chat_completions(request, target, dialect)
    return await passthrough(request, target)


async def chat_completions(request: web.Request, target: Target,
                           dialect: Dialect | None = None) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    acct = Accounting(state, request, dialect.name if dialect is not None
                      else "chat_completions")
    acct.model = ""
    try:
        length = request.content_length
        if length is not None and MAX_PARSED_BYTES < length <= state.settings.max_body_bytes \
                and body_encoding(request.headers) is None:
            # Too large to read: streamed through as it comes, never held in memory.
            chat = ChatRequest.unread(b"", target.agent, dialect)
            state.record.floor(pass_through(chat, "too_large", "too_large"))
            acct.verdict = "none; reason=too_large"
            response, gone = await forward(state, request, target, acct, verdict=acct.verdict)
            return acct.answer(response, gone=gone)
        hold = state.bodies.hold()
        try:
            return await _chat(request, target, state, acct, hold, dialect=dialect)
        finally:
            hold.release()
    except (asyncio.CancelledError, ConnectionError):
        # Cancelled while waiting, or a write found the client gone: either way it left.
        acct.gone = True
        raise
    finally:
        acct.finish()


async def _chat(request: web.Request, target: Target, state: ProxyState, acct: Accounting,
                hold: Hold, *, dialect: Dialect | None) -> web.StreamResponse:
    """Read and parse the body (within the budget, held for the caller), then the exchange."""
    try:
        settings = state.settings
        raw = await _read_body(request, settings.max_body_bytes, state.offload,
                               rate=settings.min_body_rate, grace=settings.idle_timeout,
                               hold=hold, reads=state.body_reads)
        if len(raw) > MAX_PARSED_BYTES or (is_large_body(len(raw))
                                           and raw.count(b"{") > MAX_OBJECTS):
            chat = ChatRequest.unread(raw, target.agent, dialect)
        else:
            # Parsing megabytes of JSON is CPU work: a large body is parsed off the loop.
            chat = (await state.offload(_parsed, raw, target.agent, dialect)
                    if is_large_body(len(raw)) else _parsed(raw, target.agent, dialect))
    except Rejected as exc:
        state.record.rejected(exc.reason)
        refused = error_response(exc, acct.request_id, dialect)
        if isinstance(exc, Busy):
            refused.headers["Retry-After"] = "1"
        if isinstance(exc, BodyTimeout | Busy | ShuttingDown):
            refused.force_close()  # the rest of the body is not worth waiting for
        return acct.answer(refused)
    acct.model = chat.model
    finished = await ChatExchange(state, request, target, chat,
                                  request_id=acct.request_id, started=acct.started).run()
    acct.verdict = finished.verdict
    return acct.answer(finished.response, gone=finished.client_gone)


async def _read_body(request: web.Request, limit: int, offload: Any, *, rate: int,
                     grace: float, hold: Hold, reads: BodyReads) -> bytes:
    """The body as the chat route reads it: decoded, within ``limit`` both ways, arriving at
    ``rate`` bytes/s at least (after a start of ``grace`` seconds), every byte held in
    ``hold`` as it arrives; by the drain's body deadline once the drain began."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(
            f"request body of {request.content_length} bytes is over the {limit}-byte limit")
    expected = request.content_length if request.content_length is not None else limit
    content = request.content
    if content.is_eof() and content.exception() is None:
        # The whole body came with the head (most requests): no timer to arm.
        raw = _taken(content.read_nowait(), 0, limit, hold)
    else:
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(grace + expected / rate) as deadline:
                with reads.reading(deadline):
                    async for chunk in content.iter_any():
                        size += len(_taken(chunk, size, limit, hold))
                        parts.append(chunk)
        except TimeoutError as exc:
            if reads.draining:
                raise ShuttingDown("tailfloor is shutting down; retry on another "
                                   "instance") from exc
            raise BodyTimeout(f"the request body arrived slower than {rate} bytes/s") from exc
        raw = b"".join(parts)
    encoding = body_encoding(request.headers)
    if encoding is None:
        return raw
    if not decodable(encoding):
        raise UnsupportedEncoding(f"chat request bodies in {encoding!r} are not supported; "
                                  "send gzip, deflate or an uncompressed body")
    decoded: bytes = (await offload(decode, raw, encoding, limit) if len(raw) > _DECODE_INLINE
                      else decode(raw, encoding, limit))
    if not hold.take(len(decoded)):
        raise Busy("tailfloor holds as many request bodies as it may; retry shortly")
    return decoded


def _taken(chunk: bytes, before: int, limit: int, hold: Hold) -> bytes:
    """A piece of the body, counted against the limit and held in the budget."""
    if before + len(chunk) > limit:
        raise BodyTooLarge(f"request body is over the {limit}-byte limit")
    if not hold.take(len(chunk)):
        raise Busy("tailfloor holds as many request bodies as it may; retry shortly")
    return chunk


def _parsed(raw: bytes, agent: str | None, dialect: Dialect | None) -> ChatRequest:
    body = _parse_json_object(raw)
    if dialect is None:
        return ChatRequest.parse(raw, body, agent)
    return ChatRequest.translated(raw, body, agent, dialect)


def _parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _shape(request: web.Request) -> Dialect | None:
    """The error shape of an answer given before the target is routed: the path's, so an
    Anthropic client gets Anthropic's errors even for what is refused before its request is
    read (worked out only then, off the common path)."""
    return _dialect_of(request.raw_path) if request.method == "POST" else None


def _dialect_of(raw_path: str) -> Dialect | None:
    """The dialect a request target's path ends in, read before the target is parsed (for
    errors tailfloor gives before it knows the route)."""
    path = route_path(raw_path.split("?", 1)[0].split("#", 1)[0])
    return next((d for suffix, d in DIALECT_PATHS.items() if path.endswith(suffix)), None)


def _draining(request_id: str, dialect: Dialect | None = None) -> web.Response:
    body = error_body("tailfloor is shutting down; retry on another instance",
                      "server_error", "shutting_down")
    return web.Response(
        body=body if dialect is None else dialect.error_body(body),
        status=503, content_type=JSON,
        headers={"Connection": "close", "x-tailfloor-request-id": request_id})


async def not_here(request: web.Request) -> web.Response:
    """``/tailfloor/*`` on the proxy port: introspection lives on the admin listener only."""
    return web.Response(
        body=error_body("tailfloor's introspection routes are served on the admin listener "
                        "(--admin-listen)", "invalid_request_error", "not_found"),
        status=404, content_type=JSON)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if state.draining or not state.ready or state.starting:
        return web.Response(text="not ready\n", status=503)
    if state.transcripts is not None and not state.transcripts.indexed:
        # Requests are served meanwhile, passed through: a replica that has its sessions
        # indexed should take them, and a rollout should wait for this one.
        return web.Response(text="not ready: indexing transcripts\n", status=503)
    if state.transcripts is not None and not state.transcripts.watcher_ok():
        return web.Response(text="not ready: the transcript watcher is down\n", status=503)
    if state.connections is not None and state.connections.near_limit():
        return web.Response(text="not ready: near the client connection limit\n", status=503)
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

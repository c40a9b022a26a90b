"""HTTP handlers: the dispatch of every request, the chat route's entry, health and metrics.

``route`` parses the raw request target once (``target.py``) and picks the chat route or the
passthrough from it (never from aiohttp's decoded path). The chat handler reads and parses
the body once and hands the request to ``ChatExchange`` (``exchange.py``, the request path
itself); ``Accounting`` does the bookkeeping of both routes.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from proxy.chat import ChatRequest
from proxy.errors import (
    BodyTimeout,
    Busy,
    InvalidHeader,
    Rejected,
    ShuttingDown,
    error_body,
)
from proxy.floor.decision import pass_through
from proxy.health.verdict import INDEXING, NEAR_LIMIT, NOT_READY, READY, STARTING, WATCHER_DOWN
from proxy.metrics import CONTENT_TYPE_LATEST
from proxy.server.accounting import Accounting, refused, request_id
from proxy.server.answers import JSON, error_response
from proxy.server.body import body_encoding
from proxy.server.body_cost import MAX_PARSED_BYTES
from proxy.server.chat_body import Spill, read_body
from proxy.server.exchange import ChatExchange
from proxy.server.held_bodies import Hold
from proxy.server.parsing import parse
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
            return await _unread(state, request, target, acct, dialect=dialect)
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


async def _unread(state: ProxyState, request: web.Request, target: Target, acct: Accounting,
                  *, dialect: Dialect | None, spill: Spill | None = None
                  ) -> web.StreamResponse:
    """A body too large to parse, forwarded as it came (what was read of it, then the rest
    as it arrives)."""
    chat = ChatRequest.unread(b"", target.agent, dialect)
    state.record.floor(pass_through(chat, "too_large", "too_large"))
    acct.verdict = "none; reason=too_large"
    response, gone = await forward(state, request, target, acct, verdict=acct.verdict,
                                   body=spill.body() if spill is not None else None,
                                   dialect=dialect)
    return acct.answer(response, gone=gone)


async def _chat(request: web.Request, target: Target, state: ProxyState, acct: Accounting,
                hold: Hold, *, dialect: Dialect | None) -> web.StreamResponse:
    """Read and parse the body (within the budget, held for the caller), then the exchange."""
    try:
        settings = state.settings
        read = await read_body(request, settings.max_body_bytes, rate=settings.min_body_rate,
                               grace=settings.idle_timeout, hold=hold, reads=state.body_reads)
        if isinstance(read, Spill):
            return await _unread(state, request, target, acct, dialect=dialect, spill=read)
        chat = await parse(state, read, hold, target.agent, dialect,
                           owner=state.recovery.scopes.first(request.headers))
        del read  # the request's own reference to the body: ``chat`` holds it as long as needed
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
    code = readiness(request.app[STATE_KEY])
    if code == READY:
        return web.Response(text="ready\n")
    return web.Response(text=NOT_READY[code] + "\n", status=503)


def readiness(state: ProxyState) -> int:
    """``READY`` or why not (a key of ``NOT_READY``): what ``/readyz`` says, here and in the
    answers to the health process's questions."""
    if state.draining or not state.ready or state.starting:
        return STARTING
    if state.transcripts is not None and not state.transcripts.indexed:
        # Requests are served meanwhile, passed through: a replica that has its sessions
        # indexed should take them, and a rollout should wait for this one.
        return INDEXING
    if state.transcripts is not None and not state.transcripts.watcher_ok():
        return WATCHER_DOWN
    if state.connections is not None and state.connections.near_limit():
        return NEAR_LIMIT
    return READY


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(body=state.metrics.exposition(),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def sessions(request: web.Request) -> web.Response:
    """Metadata of every tracked session (never message content)."""
    service = request.app[STATE_KEY].transcripts
    listing = service.sessions_summary() if service is not None else []
    return web.Response(body=orjson.dumps({"sessions": listing}), content_type=JSON)

"""Giving the client its answer: an upstream answer relayed or read whole, tailfloor's own
reply, or its error in the request's dialect.

``deliver`` returns the ``Finished`` answer; what it saw (usage, finish reason, a stream's
outcome, a failure) goes into the request's ``Trail``, and ``seen`` is what recovery's check
after the answer reads. A complete answer is read whole (up to 8 MiB, for its usage); a
larger one is passed on as it arrives, unread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict

from proxy.answer import AnswerSeen
from proxy.errors import ProxyError, unlinked
from proxy.floor.decision import public_verdict
from proxy.server.answers import JSON, Finished, error_response, pass_large
from proxy.server.attempts import Attempted
from proxy.server.guard import start_answer
from proxy.server.relay import broken_kind, relay_stream
from proxy.server.sse import StreamScanner, read_body_facts
from proxy.server.state import ProxyState
from proxy.server.trail import Trail
from proxy.upstream.headers import response_headers
from proxy.upstream.pool import UpstreamResponse

__all__ = ["PLAIN_ANSWER_LIMIT", "AnswerDelivery"]

PLAIN_ANSWER_LIMIT = 8 * 1024 * 1024


class _CoalescedStream(web.StreamResponse):
    """Sends the response head together with the first event (one write, one TCP segment
    less before the first token); an idle stream's first keep-alive flushes it too."""

    _send_headers_immediately = False


class AnswerDelivery:
    def __init__(self, state: ProxyState, request: web.Request, trail: Trail,
                 answered: Callable[[AnswerSeen], Awaitable[None]]) -> None:
        self.state = state
        self.request = request
        self.trail = trail
        # recovery's look at a streamed answer, before the client has all of it (a complete
        # answer's goes out after the exchange returns it: the exchange looks then)
        self.answered = answered
        self.seen: AnswerSeen | None = None  # an answer recovery may look at afterwards

    async def deliver(self, attempted: Attempted) -> Finished:
        trail, verdict = self.trail, attempted.outgoing.verdict
        if attempted.failure is not None:
            return Finished(self._error(attempted.failure), verdict)
        if attempted.reply is not None:
            chat = trail.chat
            reply = attempted.reply.body if chat.dialect is None else \
                chat.dialect.error_body(attempted.reply.body)
            return Finished(web.Response(
                body=reply, status=attempted.reply.status, content_type=JSON,
                headers={"x-tailfloor-request-id": trail.request_id}), verdict)
        upstream = attempted.upstream
        assert upstream is not None
        if attempted.error_answer is not None:
            return self._plain(upstream, attempted.error_answer, attempted)
        if upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await self._stream(upstream, attempted)
        try:
            answer, whole = await upstream.read_up_to(PLAIN_ANSWER_LIMIT)
        except ProxyError as exc:
            trail.failure = unlinked(exc)
            return Finished(self._error(exc), verdict)
        if not whole:
            trail.large_answer = True
            finished, broke = await pass_large(
                self.request, upstream, answer, headers=self._headers(upstream, verdict),
                verdict=verdict)
            if broke is not None:
                trail.failure = unlinked(broke)
                if trail.attempts:  # the report, the spans and the inspector say it broke
                    last = trail.attempts[-1]
                    trail.attempts = (*trail.attempts[:-1],
                                      last._replace(broke=broken_kind(broke)))
            return finished
        return self._plain(upstream, answer, attempted)

    def _error(self, exc: ProxyError) -> web.Response:
        return error_response(exc, self.trail.request_id, self.trail.chat.dialect)

    def _headers(self, upstream: UpstreamResponse, verdict: str) -> CIMultiDict[str]:
        headers = response_headers(upstream.headers, keep_length=False)
        headers["x-tailfloor-request-id"] = self.trail.request_id
        mode = self.state.settings.tailfloor_header
        if mode != "off":
            headers["x-tailfloor"] = verdict if mode == "detailed" else public_verdict(verdict)
        return headers

    def _plain(self, upstream: UpstreamResponse, answer: bytes, attempted: Attempted
               ) -> Finished:
        trail, outgoing = self.trail, attempted.outgoing
        verdict = outgoing.verdict
        began = time.perf_counter()
        if upstream.status == 200:
            usage, answer, finish_reason, trail.response_model = read_body_facts(
                answer, outgoing.adjust, trail.chat.dialect)
            trail.usage, trail.usage_read, trail.finish_reason = usage, True, finish_reason
            self.seen = AnswerSeen(upstream.status, usage, finish_reason, None)
        response = web.Response(body=answer, status=upstream.status,
                                headers=self._headers(upstream, verdict))
        trail.proxy_seconds += time.perf_counter() - began
        trail.overhead_seen = True
        return Finished(response, verdict)

    async def _stream(self, upstream: UpstreamResponse, attempted: Attempted) -> Finished:
        trail, outgoing = self.trail, attempted.outgoing
        scanner = StreamScanner(hide_usage=attempted.usage_injected, adjust=outgoing.adjust,
                                dialect=trail.chat.dialect)
        began = time.perf_counter()

        async def before_end() -> None:
            self._stream_seen(scanner, complete=True)
            assert self.seen is not None
            await self.answered(self.seen)

        response = _CoalescedStream(status=upstream.status,
                                    headers=self._headers(upstream, outgoing.verdict))
        try:
            await start_answer(response, self.request, upstream.close)
            trail.proxy_seconds += time.perf_counter() - began
            outcome = await relay_stream(self.request, response, upstream, scanner,
                                         self.state.settings.keepalive_interval,
                                         before_end=before_end)
        except BaseException:
            upstream.close()
            self._stream_seen(scanner, complete=False)
            raise
        outcome.error_event = scanner.error is not None
        trail.stream = outcome
        if outcome.upstream_error is not None or outcome.client_gone:
            upstream.close()
        else:
            upstream.release()
        self._stream_seen(scanner, complete=not outcome.client_gone)
        if not outcome.client_gone:
            trail.proxy_seconds += outcome.proxy_seconds
            trail.overhead_seen = True
        return Finished(response, outgoing.verdict, client_gone=outcome.client_gone)

    def _stream_seen(self, scanner: StreamScanner, *, complete: bool) -> None:
        """What a stream said, however far it went (a stream cut short counts its usage
        only when it got that far)."""
        trail = self.trail
        trail.usage = scanner.usage
        trail.usage_read = complete or scanner.usage is not None
        trail.finish_reason = scanner.finish_reason
        trail.response_model = scanner.model
        self.seen = AnswerSeen(200, scanner.usage, scanner.finish_reason, scanner.error)

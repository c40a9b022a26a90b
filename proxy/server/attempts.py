"""The upstream call of one chat request: one attempt, and one retry when recovery asks for it.

``attempt`` sends what the request's ``Outgoing`` says, reads an error answer (its first MiB
tells whether it is an overflow), lets recovery decide, and sends the retry recovery made
(a compaction, or the same messages with a lower output limit). It returns one value,
``Attempted``: the answer to relay, or the reply tailfloor gives instead, or the failure that
left no answer; every attempt and recovery step is in the request's ``Trail``.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from proxy.answer import ErrorReply, UpstreamAnswer
from proxy.chat import is_large_body
from proxy.errors import AnswerTooLarge, ProxyError, Rejected, unlinked
from proxy.recovery.outcome import ErrorStep
from proxy.recovery.request import RecoveryRequest
from proxy.report import Attempt
from proxy.server.outgoing import Outgoing
from proxy.server.state import ProxyState
from proxy.server.target import Target
from proxy.server.trail import Trail
from proxy.upstream.headers import forward_headers
from proxy.upstream.pool import Replayed, UpstreamResponse
from proxy.upstream.stream_options import names_stream_options
from proxy.values import frozen_value
from proxy.wire.stream_usage import with_stream_usage

__all__ = ["ERROR_BODY_LIMIT", "Attempted", "UpstreamAttempts"]

# An error's first MiB tells whether it is an overflow; more is dropped, never held.
ERROR_BODY_LIMIT = 1024 * 1024


@frozen_value
class Attempted:
    """How the upstream call ended: exactly one of ``upstream`` (an answer whose head
    arrived; ``error_answer`` holds the body already read of an error answer passed on),
    ``reply`` (tailfloor answers the client itself) or ``failure`` (no answer at all)."""

    outgoing: Outgoing
    upstream: UpstreamResponse | None = None
    usage_injected: bool = False  # the stream's usage-only event is hidden from the client
    error_answer: bytes | None = None
    reply: ErrorReply | None = None
    failure: ProxyError | None = None


class UpstreamAttempts:
    def __init__(self, state: ProxyState, request: web.Request, target: Target,
                 trail: Trail) -> None:
        self.state = state
        self.request = request
        self.target = target
        self.trail = trail
        self._traceparent: str | None = None

    async def attempt(self, view: RecoveryRequest | None, outgoing: Outgoing) -> Attempted:
        trail = self.trail
        number = 0
        while True:
            trail.outgoing = outgoing
            began = time.perf_counter()
            # This attempt's span, the parent of the upstream's own (telemetry builds it
            # from the report with this id).
            self._traceparent = trail.trace.child() if trail.trace is not None else None
            try:
                upstream, injected, body = await self._send(outgoing)
                self._attempted(number, began, upstream.status, len(body), outgoing=outgoing)
                if upstream.status < 400:
                    return Attempted(outgoing, upstream, usage_injected=injected)
                answer = await _error_body(upstream)
            except asyncio.CancelledError:
                # The client left before the answer's head: the attempt was still made (the
                # upstream was told its span as the parent), so it stays in the report,
                # unless its head came (an error body was being read): it is in already.
                if len(trail.attempts) <= number:
                    self._attempted(number, began, None, 0, outgoing=outgoing,
                                    error="cancelled")
                raise
            except ProxyError as exc:
                self._attempted(number, began, None, 0, outgoing=outgoing, error=exc.reason)
                trail.rejected = isinstance(exc, Rejected)  # a header the head cannot carry
                trail.failure, trail.failed_before_answer = unlinked(exc), True
                return Attempted(outgoing, failure=exc)
            decided = time.perf_counter()
            step = await self._on_error(view, outgoing, UpstreamAnswer(
                upstream.status, upstream.headers.get("Content-Type"), answer), number)
            trail.steps = (*trail.steps, step)
            trail.proxy_seconds += time.perf_counter() - decided
            retry = outgoing.retried(step) if number == 0 else None
            if retry is not None:  # the error answer was read whole: its connection is back
                outgoing, number = retry, 1
                continue
            if step.action == "reply" and step.reply is not None:
                return Attempted(outgoing, reply=step.reply)
            return Attempted(outgoing, upstream, error_answer=answer)

    def _attempted(self, number: int, began: float, status: int | None, size: int, *,
                   outgoing: Outgoing, error: str | None = None) -> None:
        now = time.perf_counter()
        self.trail.attempts = (*self.trail.attempts, Attempt(
            number, status, began - self.trail.started, now - began, error,
            body_bytes=size, compacted=outgoing.compaction is not None,
            traceparent=self._traceparent))

    async def _send(self, outgoing: Outgoing) -> tuple[UpstreamResponse, bool, bytes]:
        """Send the attempt (asking a stream for its usage when the client did not); the
        answer, whether usage was asked for, and the body sent."""
        state, chat = self.state, self.trail.chat
        upstream_url = state.settings.upstream
        ask_usage = (chat.inspected and chat.stream and not chat.include_usage
                     and state.settings.inject_stream_usage
                     and state.stream_options.accepted(upstream_url))
        body = await self._body(outgoing, ask_usage)
        injected = ask_usage and body is not None
        if body is None:
            body = await self._body(outgoing, False)
            assert body is not None
        # The body goes upstream decoded (proxy/server/body.py), never with the client's coding.
        headers = forward_headers(self.request.headers, identity_encoding=True,
                                  decoded_body=True)
        traceparent = self._traceparent
        if traceparent is not None:
            headers.popall("traceparent", None)  # the client's: ours replaces it
            if self.trail.client_traceparent is None:
                headers.popall("tracestate", None)  # it belonged to a context not kept
        path, query = self.target.path, self.target.query
        upstream = await state.upstream.send("POST", path, query, headers, body,
                                             traceparent=traceparent)
        if not injected or upstream.status != 400:
            return upstream, injected, body
        answer = await _error_body(upstream)
        if not names_stream_options(answer):
            return Replayed(upstream, answer), injected, body
        # This upstream does not know stream_options: remember (for a while), and send the
        # request as the client did, built the same way as the first.
        state.stream_options.refused(upstream_url)
        self.trail.stream_options_refused = True
        body = await self._body(outgoing, False)
        assert body is not None
        again = await state.upstream.send("POST", path, query, headers, body,
                                          traceparent=traceparent)
        return again, False, body

    async def _body(self, outgoing: Outgoing, ask_usage: bool) -> bytes | None:
        """What goes upstream for ``outgoing``: with the stream's usage asked for (None when
        that cannot be written), in the client's dialect."""
        chat = self.trail.chat
        body = outgoing.body
        if ask_usage:
            found = with_stream_usage(body, chat.body)
            if found is None:
                return None
            body = found
        if chat.dialect is None:
            return body
        # Rendering a large rewrite in the client's dialect is CPU work: off the loop.
        return (await self.state.offload(chat.outgoing, body) if is_large_body(len(body))
                else chat.outgoing(body))

    async def _on_error(self, view: RecoveryRequest | None, sent: Outgoing,
                        answer: UpstreamAnswer, number: int) -> ErrorStep:
        # A bug in recovery must cost the recovery, never the request.
        try:
            return await self.state.recovery.on_error(view, sent.compaction, answer,
                                                      attempt=number, clamped=sent.clamp)
        except Exception:
            self.state.log.exception("overflow recovery failed; the upstream's answer is "
                                     "passed on")
            return ErrorStep.passed(overflow="failed")


async def _error_body(upstream: UpstreamResponse) -> bytes:
    answer, whole = await upstream.read_up_to(ERROR_BODY_LIMIT)
    if not whole:  # more than any decision needs: dropped, never held
        upstream.close()
        raise AnswerTooLarge(f"the upstream's error answer ({upstream.status}) is over "
                             f"{ERROR_BODY_LIMIT} bytes")
    return answer

"""One chat request from the moment it is parsed until the client has its answer.

``ChatExchange.run`` reads as the request path: the floor rewrite, the recovery stage's
chance to compact first, the upstream call (with one retry when recovery asks for it), then
relaying the answer and recording what happened.
"""

from __future__ import annotations

import time

from aiohttp import web
from multidict import CIMultiDict

from proxy.errors import ProxyError, Rejected, to_response_parts
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
from proxy.server.relay import relay_stream
from proxy.server.sse import StreamScanner, read_body_usage
from proxy.server.state import ProxyState
from proxy.server.target import Target
from proxy.upstream.pool import Replayed as _Replayed
from proxy.upstream.pool import UpstreamResponse, forward_headers, response_headers

JSON = "application/json"
# Marks a response whose client a write found gone (a 499 and a disconnect, not an error).
CLIENT_GONE = "tailfloor_client_gone"


def error_response(exc: ProxyError, request_id: str) -> web.Response:
    status, body = to_response_parts(exc)
    return web.Response(body=body, status=status, content_type=JSON,
                        headers={"x-tailfloor-request-id": request_id})


class _CoalescedStream(web.StreamResponse):
    """Sends the response head together with the first event (one write, one TCP segment
    less before the first token); an idle stream's first keep-alive flushes it too."""

    _send_headers_immediately = False


class ChatExchange:
    """One chat request from the moment it is parsed until the client has its answer."""

    def __init__(self, state: ProxyState, request: web.Request, target: Target,
                 chat: ChatRequest, *, request_id: str, started: float) -> None:
        self.state = state
        self.request = request
        self.target = target
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
            except Rejected as exc:  # a header the upstream head cannot carry
                state.metrics.rejected.labels(reason=exc.reason).inc()
                return error_response(exc, self.request_id)
            except ProxyError as exc:
                state.metrics.upstream_errors.labels(kind=exc.reason).inc()
                state.log.warning("upstream failed before answering: %s", exc.message)
                return error_response(exc, self.request_id)
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
                return error_response(exc, self.request_id)
            return self._finish_plain(upstream, answer, rewrite)
        return await self._finish_stream(
            upstream, StreamScanner(hide_usage=hide_usage, adjust=self.adjust), rewrite)

    async def _send(self, rewrite: Rewrite) -> tuple[UpstreamResponse, bool]:
        """Send the body upstream; returns the response and whether usage is to be hidden."""
        state, chat = self.state, self.chat
        hide_usage = (chat.stream and not chat.include_usage
                      and state.settings.inject_stream_usage and not state.stream_options_rejected)
        body = with_stream_usage(rewrite.body, chat.body) if hide_usage else rewrite.body
        # The body goes upstream decoded (proxy/body.py), so never with the client's coding.
        headers = forward_headers(self.request.headers, identity_encoding=True,
                                  decoded_body=True)
        path, query = self.target.path, self.target.query
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
            usage, answer, finish_reason = read_body_usage(answer, self.adjust)
            self._count_usage(usage)
            self.state.recovery.after_answer(self.chat, rewrite, Outcome(
                upstream.status, usage, finish_reason, None))
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
        except ConnectionError:
            # A write found the client gone: nothing more to send, nothing wrong on our side.
            upstream.close()
            response[CLIENT_GONE] = True
            self._stream_seen(rewrite, upstream.status, scanner)
            return response
        except BaseException:
            upstream.close()
            self._stream_seen(rewrite, upstream.status, scanner)
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

    def _stream_seen(self, rewrite: Rewrite, status: int, scanner: StreamScanner) -> None:
        """A stream cut short by the client: what was read still counts (tokens used, an
        overflow error event the client got before it left)."""
        if scanner.usage is not None:
            self._count_usage(scanner.usage)
        self.state.recovery.after_answer(self.chat, rewrite, Outcome(
            status, scanner.usage, scanner.finish_reason, scanner.error))

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



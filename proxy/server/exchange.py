"""One chat request from the moment it is parsed until the client has its answer.

``ChatExchange.run`` reads as the request path:

    context (signals, policy, model, session: once) -> the floor -> recovery before sending
    -> the upstream call (one retry when recovery compacts after an overflow error)
    -> relaying the answer -> recovery's look at the answer

Every stage returns a value and the exchange hands it to the ``Recorder``; work that can be
heavy (transcript reads, counting a large request, the compaction store) runs in the worker
pool, never on the event loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from aiohttp import web
from multidict import CIMultiDict

from proxy.context import (
    LARGE_BYTES,
    RequestContext,
    build_context,
    first_of_session,
    is_large,
    runs_ahead,
)
from proxy.errors import AnswerTooLarge, ProxyError, Rejected
from proxy.floor.decision import Decision, none
from proxy.identity.identify import identify
from proxy.model import AnswerSeen, ChatRequest, UpstreamAnswer, with_stream_usage
from proxy.recovery.outcome import ErrorStep, Prepared
from proxy.recovery.request import RecoveryRequest
from proxy.server.answers import JSON, Finished, error_response, pass_large
from proxy.server.guard import start_answer
from proxy.server.outgoing import Outgoing
from proxy.server.relay import relay_stream
from proxy.server.sse import StreamScanner, read_body_usage
from proxy.server.state import ProxyState
from proxy.server.target import Target
from proxy.upstream.headers import forward_headers, response_headers
from proxy.upstream.pool import Replayed, UpstreamResponse
from proxy.upstream.stream_options import names_stream_options

LAG_WAIT = 0.2  # seconds a request that runs ahead of its transcript may wait for it
ACTIVE_WITHIN = 2.0  # only while some transcript changed this recently
# What an answer may cost in memory: an error's first MiB tells whether it is an overflow;
# a complete answer over 8 MiB is passed on as it arrives instead of being held.
ERROR_BODY_LIMIT = 1024 * 1024
PLAIN_ANSWER_LIMIT = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sent:
    """An upstream answer whose head arrived, and whether tailfloor added the stream's usage
    request (so the usage-only event is hidden from the client again)."""

    upstream: UpstreamResponse
    usage_injected: bool = False


class _CoalescedStream(web.StreamResponse):
    """Sends the response head together with the first event (one write, one TCP segment
    less before the first token); an idle stream's first keep-alive flushes it too."""

    _send_headers_immediately = False


class ChatExchange:
    def __init__(self, state: ProxyState, request: web.Request, target: Target,
                 chat: ChatRequest, *, request_id: str, started: float) -> None:
        self.state = state
        self.request = request
        self.target = target
        self.chat = chat
        self.request_id = request_id
        self.started = started
        self.proxy_seconds = 0.0

    async def run(self) -> Finished:
        state, chat = self.state, self.chat
        ctx = await self._context()
        decision = await self._floor(ctx)
        state.record.floor(decision)
        outgoing = Outgoing(decision, report_client_usage=ctx.policy.report_usage == "client")
        view = None
        if chat.inspected and chat.pass_reason is None:
            view = (await state.offload(state.recovery.view, ctx, outgoing.draft) if ctx.large
                    else state.recovery.view(ctx, outgoing.draft))
        prepared = await self._before_send(view)
        if prepared is not None:
            state.record.prepared(prepared)
            outgoing = replace(outgoing, compaction=prepared.compaction, clamp=prepared.clamp)
        self.proxy_seconds += time.perf_counter() - self.started
        attempt = 0
        while True:
            try:
                sent = await self._send(outgoing)
                upstream = sent.upstream
                if upstream.status < 400:
                    break
                answer, whole = await upstream.read_up_to(ERROR_BODY_LIMIT)
                if not whole:  # more than any decision needs: dropped, never held
                    upstream.close()
                    raise AnswerTooLarge(f"the upstream's error answer ({upstream.status}) "
                                         f"is over {ERROR_BODY_LIMIT} bytes")
            except Rejected as exc:  # a header the upstream head cannot carry
                state.metrics.rejected.labels(reason=exc.reason).inc()
                return Finished(self._error(exc), outgoing.verdict)
            except ProxyError as exc:
                state.metrics.upstream_errors.labels(kind=exc.reason).inc()
                state.log.warning("upstream failed before answering: %s", exc.message)
                return Finished(self._error(exc), outgoing.verdict)
            decided = time.perf_counter()
            step = await self._on_error(
                view, outgoing,
                UpstreamAnswer(upstream.status, upstream.headers.get("Content-Type"), answer),
                attempt)
            state.record.error_step(step, chat.model)
            if state.shared is not None and step.learned_window is not None:
                state.shared.kick()  # the other replicas learn the window before they need it
            if step.learned_window is not None and view is not None:
                view = replace(view, ctx=view.ctx.with_window(step.learned_window))
            self.proxy_seconds += time.perf_counter() - decided
            retry = outgoing.retried(step) if attempt == 0 else None
            if retry is not None:
                outgoing, attempt = retry, 1
                continue
            if step.action == "reply" and step.reply is not None:
                reply = step.reply.body if chat.dialect is None else \
                    chat.dialect.error_body(step.reply.body)
                return Finished(web.Response(
                    body=reply, status=step.reply.status, content_type=JSON,
                    headers={"x-tailfloor-request-id": self.request_id}), outgoing.verdict)
            return await self._finish_plain(upstream, answer, outgoing, view)
        if not upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
            try:
                answer, whole = await upstream.read_up_to(PLAIN_ANSWER_LIMIT)
            except ProxyError as exc:
                state.metrics.upstream_errors.labels(kind=exc.reason).inc()
                return Finished(self._error(exc), outgoing.verdict)
            if not whole:
                return await pass_large(self.state, self.request, upstream, answer,
                                        headers=self._client_headers(upstream,
                                                                     outgoing.verdict),
                                        verdict=outgoing.verdict)
            return await self._finish_plain(upstream, answer, outgoing, view)
        return await self._finish_stream(
            upstream, StreamScanner(hide_usage=sent.usage_injected, adjust=outgoing.adjust,
                                    dialect=chat.dialect),
            outgoing,
            view)

    # ------------------------------------------------------------------ stages
    async def _context(self) -> RequestContext:
        state, chat = self.state, self.chat
        rules = state.rules.rules
        signals = None
        if is_large(chat):
            # Its signals take a pass over every message, off the loop; the session lookup
            # (memory) stays on it, where the fingerprint memory lives.
            signals = await state.offload(identify, chat.agent_id, self.request.headers,
                                          chat.body, rules.identification)
        ctx = build_context(chat, self.request.headers, rules, windows=state.windows,
                            upstream=state.settings.upstream, sessions=state.sessions,
                            signals=signals, ratios=state.ratios)
        shared = state.shared
        if shared is not None:
            shared.kick()
            tracked = state.transcripts is not None and len(state.transcripts.catalog) > 0
            if tracked and ctx.print_ is not None and first_of_session(ctx) and \
                    await shared.facts.pull_print(ctx.print_):
                # Another replica saw this system prompt and tools: its sessions may be the
                # predecessor of this new one.
                ctx = build_context(chat, self.request.headers, rules, windows=state.windows,
                                    upstream=state.settings.upstream, sessions=state.sessions,
                                    signals=ctx.signals, ratios=state.ratios)
        service = state.transcripts
        if service is None or not runs_ahead(ctx) or not service.active(ACTIVE_WITHIN):
            return ctx
        # A conversation no transcript holds while an agent is writing: the watcher may not
        # have seen its newest turns yet. Wait for its next batch (bounded), then look again.
        began = time.perf_counter()
        changed = False
        while runs_ahead(ctx):
            left = LAG_WAIT - (time.perf_counter() - began)
            if left <= 0 or not await service.next_change(left):
                break
            changed = True
            ctx = build_context(chat, self.request.headers, rules, windows=state.windows,
                                upstream=state.settings.upstream, sessions=state.sessions,
                                signals=ctx.signals, ratios=state.ratios)
        outcome = "timeout" if not changed else (
            "identified" if ctx.lineage.identified else "unidentified")
        state.metrics.identification_wait.labels(outcome=outcome).observe(
            time.perf_counter() - began)
        return ctx

    async def _floor(self, ctx: RequestContext) -> Decision:
        floor = self.state.floor
        if not ctx.chat.inspected:
            return none(ctx.chat, "too_large", "too_large")
        if ctx.chat.pass_reason is not None:
            self.state.metrics.dialect_passthrough.labels(
                route=ctx.chat.route, reason=ctx.chat.pass_reason).inc()
            return none(ctx.chat, ctx.chat.pass_reason, "unidentified")
        if floor is None:
            return none(ctx.chat, "no_transcripts", "unidentified")
        settled = floor.settle(ctx)
        if settled is not None:
            return settled
        return await self.state.offload(floor.decide, ctx)

    async def _send(self, outgoing: Outgoing) -> Sent:
        """Send the body upstream (asking a stream for its usage when the client did not)."""
        state, chat = self.state, self.chat
        upstream_url = state.settings.upstream
        hide_usage = (chat.inspected and chat.stream and not chat.include_usage
                      and state.settings.inject_stream_usage
                      and state.stream_options.accepted(upstream_url))
        injected = with_stream_usage(outgoing.body, chat.body) if hide_usage else None
        hide_usage = injected is not None
        body = injected if injected is not None else outgoing.body
        if chat.dialect is not None:
            # Rendering a large rewrite in the client's dialect is CPU work: off the loop.
            body = (await state.offload(chat.outgoing, body) if len(body) > LARGE_BYTES
                    else chat.outgoing(body))
        # The body goes upstream decoded (proxy/server/body.py), never with the client's coding.
        headers = forward_headers(self.request.headers, identity_encoding=True,
                                  decoded_body=True)
        path, query = self.target.path, self.target.query
        upstream = await state.upstream.send("POST", path, query, headers, body)
        if hide_usage and upstream.status == 400:
            answer, whole = await upstream.read_up_to(ERROR_BODY_LIMIT)
            if not whole:
                upstream.close()
                raise AnswerTooLarge(f"the upstream's error answer is over {ERROR_BODY_LIMIT} "
                                     "bytes")
            if not names_stream_options(answer):
                return Sent(Replayed(upstream, answer))
            # This upstream does not know stream_options: remember (for a while), and send
            # the request as the client did.
            state.stream_options.refused(upstream_url)
            if state.shared is not None:
                state.shared.kick()
            state.metrics.upstream_errors.labels(kind="stream_options_rejected").inc()
            upstream = await state.upstream.send("POST", path, query, headers, outgoing.body)
            hide_usage = False
        return Sent(upstream, hide_usage)

    # ------------------------------------------------------------------ answers
    def _error(self, exc: ProxyError) -> web.Response:
        return error_response(exc, self.request_id, self.chat.dialect)

    def _client_headers(self, upstream: UpstreamResponse, verdict: str) -> CIMultiDict[str]:
        headers = response_headers(upstream.headers, keep_length=False)
        headers["x-tailfloor-request-id"] = self.request_id
        if self.state.settings.tailfloor_header:
            headers["x-tailfloor"] = verdict
        return headers

    async def _finish_plain(self, upstream: UpstreamResponse, answer: bytes,
                            outgoing: Outgoing, view: RecoveryRequest | None) -> Finished:
        after = time.perf_counter()
        if upstream.status == 200:
            usage, answer, finish_reason = read_body_usage(answer, outgoing.adjust,
                                                           self.chat.dialect)
            self.state.record.usage(usage, self.chat.model, self.chat.agent_id,
                                   self.chat.route)
            await self._after(view, outgoing,
                              AnswerSeen(upstream.status, usage, finish_reason, None))
        headers = self._client_headers(upstream, outgoing.verdict)
        response = web.Response(body=answer, status=upstream.status, headers=headers)
        self._observe_overhead(time.perf_counter() - after)
        return Finished(response, outgoing.verdict)

    async def _finish_stream(self, upstream: UpstreamResponse, scanner: StreamScanner,
                             outgoing: Outgoing, view: RecoveryRequest | None) -> Finished:
        state = self.state
        before = time.perf_counter()
        response = _CoalescedStream(status=upstream.status,
                                    headers=self._client_headers(upstream, outgoing.verdict))
        await start_answer(response, self.request, upstream.close)
        prepared = time.perf_counter() - before
        try:
            outcome = await relay_stream(self.request, response, upstream, scanner,
                                         state.settings.keepalive_interval)
        except ConnectionError:
            # A write found the client gone: nothing more to send, nothing wrong on our side.
            upstream.close()
            await self._stream_seen(scanner, outgoing, view)
            return Finished(response, outgoing.verdict, client_gone=True)
        except BaseException:
            upstream.close()
            await self._stream_seen(scanner, outgoing, view)
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
        state.record.usage(scanner.usage, self.chat.model, self.chat.agent_id,
                           self.chat.route)
        seen = AnswerSeen(upstream.status, scanner.usage, scanner.finish_reason, scanner.error)
        await self._after(view, outgoing, seen)
        self._observe_overhead(prepared + outcome.proxy_seconds)
        return Finished(response, outgoing.verdict)

    async def _stream_seen(self, scanner: StreamScanner, sent: Outgoing,
                           view: RecoveryRequest | None) -> None:
        """A stream cut short by the client: what was read still counts (tokens used, an
        overflow error event the client got before it left)."""
        if scanner.usage is not None:
            self.state.record.usage(scanner.usage, self.chat.model, self.chat.agent_id,
                                    self.chat.route)
        await self._after(view, sent, AnswerSeen(200, scanner.usage, scanner.finish_reason,
                                                 scanner.error))

    # A bug in recovery must cost the recovery, never the request: each phase falls back to
    # doing nothing, and says so in the log.
    async def _before_send(self, view: RecoveryRequest | None) -> Prepared | None:
        try:
            return await self.state.recovery.before_send(view)
        except Exception:
            self.state.log.exception("overflow recovery failed before sending; the request "
                                     "goes as it was")
            return None

    async def _on_error(self, view: RecoveryRequest | None, sent: Outgoing,
                        answer: UpstreamAnswer, attempt: int) -> ErrorStep:
        try:
            return await self.state.recovery.on_error(view, sent.compaction, answer,
                                                      attempt=attempt, clamped=sent.clamp)
        except Exception:
            self.state.log.exception("overflow recovery failed; the upstream's answer is "
                                     "passed on")
            return ErrorStep.passed(overflow="failed")

    async def _after(self, view: RecoveryRequest | None, sent: Outgoing,
                     seen: AnswerSeen) -> None:
        recovery = self.state.recovery
        try:
            if view is not None and view.ctx.large:
                check = await self.state.offload(recovery.after_answer, view, sent.compaction,
                                                 seen, sent.clamp)
            else:
                check = recovery.after_answer(view, sent.compaction, seen, sent.clamp)
        except Exception:
            self.state.log.exception("overflow checks after the answer failed")
            return
        self.state.record.after(check, self.chat.model)
        if self.state.shared is not None and check.learned_ratio is not None:
            self.state.shared.kick()

    def _observe_overhead(self, extra: float) -> None:
        self.state.metrics.overhead_by(self.chat.route).observe(self.proxy_seconds + extra)

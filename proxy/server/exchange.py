"""One chat request from the moment it is parsed until the client has its answer.

``ChatExchange.run`` is the request path, one stage a line:

    the context (signals, policy, model, session: once) -> the floor -> recovery's view of
    the request -> recovery before sending -> the upstream call (one retry when recovery
    compacts after an overflow error: ``attempts.py``) -> the answer, relayed or read
    (``deliver.py``) -> recovery's look at the answer

Every stage returns a value; the exchange keeps them in the request's ``Trail`` and hands it
to the ``Recorder`` once, at the end, whatever way the request ended. Work that can be heavy
(transcript reads, counting a large request, the compaction store) runs in the worker pool,
never on the event loop.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from proxy.answer import AnswerSeen
from proxy.chat import ChatRequest
from proxy.context import RequestContext, first_of_session, runs_ahead
from proxy.floor.decision import Decision, pass_through
from proxy.identity.identify import RequestSignals
from proxy.recovery.outcome import AfterCheck
from proxy.recovery.request import RecoveryRequest
from proxy.server.answers import Finished
from proxy.server.attempts import UpstreamAttempts
from proxy.server.deliver import AnswerDelivery
from proxy.server.outgoing import Outgoing
from proxy.server.state import ProxyState
from proxy.server.target import Target
from proxy.server.trail import Trail
from proxy.telemetry.tracecontext import parse_traceparent

__all__ = ["ChatExchange"]

LAG_WAIT = 0.2  # seconds a request that runs ahead of its transcript may wait for it
ACTIVE_WITHIN = 2.0  # only while some transcript changed this recently


class ChatExchange:
    def __init__(self, state: ProxyState, request: web.Request, target: Target,
                 chat: ChatRequest, *, request_id: str, started: float) -> None:
        self.state = state
        self.request = request
        self.target = target
        self.trail = Trail(request_id, chat, started)
        self._view: RecoveryRequest | None = None
        # While the first scan runs the catalog is incomplete, and looking in it would wait
        # on the scan: the request goes upstream as it came, at once.
        self._indexing = state.transcripts is not None and not state.transcripts.indexed
        if state.traces is not None:
            sent = request.headers.get("traceparent")
            client = parse_traceparent(sent) if sent else None
            self.trail.trace = state.traces.context(client)
            self.trail.client_traceparent = sent if client is not None else None

    async def run(self) -> Finished:
        trail = self.trail
        view: RecoveryRequest | None = None
        delivery: AnswerDelivery | None = None
        try:
            ctx = trail.ctx = await self._context()
            decision = trail.decision = await self._floor(ctx)
            outgoing = Outgoing(decision, report_client_usage=ctx.policy.report_usage == "client")
            view = await self._recovery_view(ctx, outgoing)
            outgoing = await self._before_send(view, outgoing)
            trail.proxy_seconds += time.perf_counter() - trail.started
            attempted = await UpstreamAttempts(self.state, self.request, self.target,
                                               trail).attempt(view, outgoing)
            self.state.record.sent(trail)
            self._view = view
            delivery = AnswerDelivery(self.state, self.request, trail, self._answered)
            finished = await delivery.deliver(attempted)
            if delivery.seen is not None and trail.after is None:
                await self._answered(delivery.seen)
            trail.status, trail.client_gone = finished.response.status, finished.client_gone
            return finished
        except (asyncio.CancelledError, ConnectionError):
            trail.client_gone = True  # the client left before its answer was complete
            raise
        finally:
            if delivery is not None and delivery.seen is not None and trail.after is None \
                    and trail.outgoing is not None:
                # What was read still counts, a stream the client left included (tokens
                # used, an overflow error event it got before it left).
                trail.after = await self._after(view, trail.outgoing, delivery.seen)
            self.state.record.finished(trail)

    # ------------------------------------------------------------------ stages
    async def _context(self) -> RequestContext:
        state, chat, headers = self.state, self.trail.chat, self.request.headers
        rules = state.rules.rules
        build = state.contexts
        # A large request's signals take a pass over every message: off the loop. The session
        # lookup (memory) stays on it, where the fingerprint memory lives.
        signals: RequestSignals | None = (
            await state.offload(build.identify, chat, headers, rules) if chat.large else None)
        ctx = build.build(chat, headers, rules, signals)
        shared = state.shared
        models = state.models
        if shared is not None and models.windows.window(models.upstream, chat.model) is None \
                and not ctx.signals.is_summarization \
                and await shared.facts.pull_window(models.upstream, chat.model):
            # Another replica met this model's window (an overflow) since the last round.
            ctx = build.build(chat, headers, rules, ctx.signals)
        if shared is not None and state.transcripts is not None and \
                len(state.transcripts.catalog) > 0 and ctx.print_ is not None and \
                first_of_session(ctx) and await shared.facts.pull_print(ctx.print_):
            # Another replica saw this system prompt and tools: its sessions may be the
            # predecessor of this new one.
            ctx = build.build(chat, headers, rules, ctx.signals)
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
            ctx = build.build(chat, headers, rules, ctx.signals)
        outcome = "timeout" if not changed else (
            "identified" if ctx.lineage.identified else "unidentified")
        self.trail.waited = (outcome, time.perf_counter() - began)
        return ctx

    async def _floor(self, ctx: RequestContext) -> Decision:
        if self._indexing:
            self.state.metrics.indexing_passthrough.labels(route=ctx.chat.route).inc()
            return pass_through(ctx.chat, "indexing", None)
        floor = self.state.floor
        settled = floor.settle(ctx)
        if settled is not None:
            return settled
        decided = await self.state.floor_lane.decide(floor.rewrite, ctx)
        if decided is None:  # not in time: the agent is not kept waiting (floor_lane.py)
            self.state.metrics.busy_passthrough.labels(route=ctx.chat.route).inc()
            return pass_through(ctx.chat, "busy", ctx.lineage.method, ctx.lineage.session_id)
        return decided

    async def _recovery_view(self, ctx: RequestContext, outgoing: Outgoing
                             ) -> RecoveryRequest | None:
        chat = ctx.chat
        if self._indexing or not chat.inspected or chat.pass_reason is not None \
                or ctx.lineage.method == "unauthenticated":  # untouched, by the agent's key
            return None
        recovery = self.state.recovery
        trace = self.trail.trace  # the summarizer's calls join it
        return (await self.state.offload(recovery.view, ctx, outgoing.draft, trace)
                if ctx.large else recovery.view(ctx, outgoing.draft, trace))

    # A bug in recovery must cost the recovery, never the request: each phase falls back to
    # doing nothing, and says so in the log.
    async def _before_send(self, view: RecoveryRequest | None, outgoing: Outgoing
                           ) -> Outgoing:
        try:
            prepared = await self.state.recovery.before_send(view)
        except Exception:
            self.state.log.exception("overflow recovery failed before sending; the request "
                                     "goes as it was")
            return outgoing
        if prepared is None:
            return outgoing
        self.trail.prepared = prepared
        return outgoing.prepared(prepared)

    async def _answered(self, seen: AnswerSeen) -> None:
        trail = self.trail
        assert trail.outgoing is not None
        trail.after = await self._after(self._view, trail.outgoing, seen)
        self.state.record.after_answer(trail)

    async def _after(self, view: RecoveryRequest | None, sent: Outgoing, seen: AnswerSeen
                     ) -> AfterCheck | None:
        recovery = self.state.recovery
        try:
            if view is not None and view.ctx.large:
                return await self.state.offload(recovery.after_answer, view, sent.compaction,
                                                seen, sent.clamp)
            return recovery.after_answer(view, sent.compaction, seen, sent.clamp)
        except Exception:
            self.state.log.exception("overflow checks after the answer failed")
            return None

"""Every metric and log line about a request, from the values the stages returned.

The floor returns a ``Decision``, recovery a ``Prepared`` (a ``Compaction``, an
``OutputClamp``), an ``ErrorStep`` and an ``AfterCheck``, the upstream call its attempts,
the relay a ``StreamOutcome``; the exchange keeps them in the request's ``Trail`` and hands
it here once (``finished``). No stage touches a metric itself, so what is counted is exactly
what happened to the request. The same trail becomes the ``RequestReport`` each consumer
(``ReportSink``: telemetry) is handed; the inspector keeps the trail itself (``TrailSink``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from proxy.cost import costs_of
from proxy.errors import ProxyError
from proxy.floor.decision import Decision
from proxy.metrics import Metrics
from proxy.policy.prices import PriceList
from proxy.recovery.outcome import AfterCheck, Compaction, ErrorStep, Prepared, SummaryAttempt
from proxy.recovery.output import OutputClamp
from proxy.report import RequestReport
from proxy.server.reports import report_of
from proxy.server.trail import Trail
from proxy.server.upstream_episodes import UpstreamEpisodes
from proxy.wire.usage import Usage

__all__ = ["Recorder", "ReportSink", "ReportSinkWithShutdown", "TrailSink"]

log = logging.getLogger("tailfloor")
floor_log = logging.getLogger("tailfloor.floor")
recovery_log = logging.getLogger("tailfloor.overflow")
_FAILURES_LOGGED = 1000


class ReportSink(Protocol):
    """A consumer of finished requests' reports (telemetry), without their content unless
    it has a true ``wants_content``."""

    def keep(self, report: RequestReport) -> None: ...


class TrailSink(Protocol):
    """A consumer that keeps the trail itself and makes its report only when it needs it
    (the inspector: most kept requests are never looked at)."""

    def keep_trail(self, trail: Trail) -> None: ...


class ReportSinkWithShutdown(ReportSink, Protocol):
    """A consumer holding work to finish when the application stops (queued exports)."""

    def shutdown(self) -> None: ...


class Recorder:
    def __init__(self, metrics: Metrics, sinks: Sequence[ReportSink] = (),
                 prices: Callable[[], PriceList] | None = None,
                 trail_sinks: Sequence[TrailSink] = (), upstream: str = "") -> None:
        self.metrics = metrics
        self.sinks = list(sinks)
        # Reports with the messages sent, for a sink that exports them (asked for by name)
        self._content = any(getattr(sink, "wants_content", False) for sink in self.sinks)
        self.prices = prices  # the rules' [[prices]] in force (they reload)
        self.trail_sinks = list(trail_sinks)
        self.episodes = UpstreamEpisodes(upstream)
        self._failures: set[str] = set()
        self._store_failing = False
        # Bounded: model and agent labels are capped (proxy/metrics.py), routes are three.
        self._token_counters: dict[tuple[str, str, str], tuple[Any, ...]] = {}

    def sent(self, trail: Trail) -> None:
        """What the request path decided, once, when the upstream call is over and before
        the answer goes out (so its log lines come before the client has its answer)."""
        if trail.sent_recorded:
            return
        trail.sent_recorded = True
        m, chat = self.metrics, trail.chat
        if trail.waited is not None:
            outcome, seconds = trail.waited
            m.identification_wait.labels(outcome=outcome).observe(seconds)
        decision = trail.decision
        if decision is not None:
            if decision.kind == "none" and chat.pass_reason is not None:
                m.dialect_passthrough.labels(route=chat.route, reason=chat.pass_reason).inc()
            self.floor(decision, chat.agent_id)
        if trail.prepared is not None:
            self.prepared(trail.prepared)
        for step in trail.steps:
            self.error_step(step, chat.model)
        if trail.stream_options_refused:
            self.upstream_error("stream_options_rejected")
        if trail.failure is not None and trail.failed_before_answer:
            self._failure(trail)

    def finished(self, trail: Trail) -> None:
        """The answer, once, when the client has it (``sent`` first, if it was not yet)."""
        chat = trail.chat
        self.sent(trail)
        self._answer(trail)
        self.after_answer(trail)
        if trail.overhead_seen:
            self.overhead(chat.route, trail.proxy_seconds)
        prices = self.prices() if self.prices is not None else None
        priced = prices is not None and prices.rows  # .rows: no __bool__ call per request
        if self.sinks or priced:
            # Without the body and messages unless a sink exports them: a sink's queue must
            # not keep a request's content alive for nothing (the inspector keeps trails).
            report = report_of(trail, content=self._content)
            if priced and prices is not None:
                self.cost(report, prices)
            for sink in self.sinks:
                try:
                    sink.keep(report)
                except Exception:  # a consumer's bug costs its view, never the request
                    log.exception("a report consumer failed; the request is not affected")
        for trail_sink in self.trail_sinks:
            try:
                trail_sink.keep_trail(trail)
            except Exception:
                log.exception("a report consumer failed; the request is not affected")

    def cost(self, report: RequestReport, prices: PriceList) -> None:
        m = self.metrics
        model = m.model_label(report.model)
        costs = costs_of(report, prices)
        if costs is None:
            if report.usage is not None:
                m.cost_unpriced.labels(model=model).inc()
            return
        agent = m.agent_label(report.agent or "none")
        for kind, dollars in costs.items():
            if dollars:
                m.cost.labels(agent=agent, model=model, kind=kind).inc(dollars)

    def after_answer(self, trail: Trail) -> None:
        """Recovery's look at the answer, once (as soon as it is made, before the client has
        all of the answer, or at the end)."""
        if trail.after is not None and not trail.after_recorded:
            trail.after_recorded = True
            self.after(trail.after, trail.chat.model)

    def _failure(self, trail: Trail, *, after_head: bool = False) -> None:
        """``after_head``: the client had the answer's head already (a large answer passed
        through, then broken): ``mid_stream``, whatever broke it."""
        failure = trail.failure
        assert failure is not None
        if trail.rejected:
            self.rejected(failure.reason)
        else:
            self.upstream_error("mid_stream" if after_head else failure.reason, failure)

    def _answer(self, trail: Trail) -> None:
        m, chat = self.metrics, trail.chat
        stream = trail.stream
        # An overflow the upstream told in an error event is the request's, not the
        # upstream's failing (counted as an overflow, outcome mid_stream).
        error_event = stream is not None and stream.error_event and not (
            trail.after is not None and trail.after.overflow == "mid_stream")
        failed_after_head = trail.failure is not None and not trail.failed_before_answer
        # An answer that failed after its head answered nothing whole: its failure (below)
        # goes on the episode, not its status.
        if trail.attempts and trail.attempts[-1].status is not None and not (
                failed_after_head or error_event
                or (stream is not None and stream.upstream_error is not None)):
            self.episodes.answered(trail.attempts[-1].status)
        if failed_after_head:
            self._failure(trail, after_head=trail.large_answer)
        if trail.large_answer:
            m.large_answers.inc()
        if stream is not None and not stream.client_gone:
            if stream.keepalives:
                m.keepalives.inc(stream.keepalives)
            if stream.first_chunk_at is not None:
                m.ttft_by(m.model_label(chat.model)).observe(stream.first_chunk_at
                                                             - trail.started)
        if stream is not None:
            # A stream broken after its head is ``mid_stream`` however it broke, as a
            # pass-through's is (``timeout``: no answer head in time, a 504); one the upstream
            # ended with its own error event is ``error_event``.
            if stream.upstream_error is not None:
                self.upstream_error("mid_stream", stream.upstream_error)
            elif error_event:
                self.upstream_error("error_event")
                self.episodes.failed("error_event", "a stream ended with the upstream's own "
                                     "error event")
        if trail.usage_read:
            self.usage(trail.usage, chat.model, chat.agent_id, chat.route)

    def overhead(self, route: str, seconds: float) -> None:
        """tailfloor's own time in a request whose answer was complete."""
        self.metrics.overhead_by(route).observe(seconds)

    def rejected(self, reason: str) -> None:
        """A request refused for what it is (a bad target, header, body...)."""
        self.metrics.rejected.labels(reason=reason).inc()

    def upstream_error(self, kind: str, exc: ProxyError | None = None) -> None:
        self.metrics.upstream_errors.labels(kind=kind).inc()
        if exc is not None:
            self.episodes.failed(kind, exc.message, exc.reason)

    def floor(self, decision: Decision, agent: str | None = None) -> None:
        m = self.metrics
        details = decision.details
        if "pins_active" in details:
            label = m.agent_label(agent) if agent is not None else "none"
            m.pins.labels(agent=label).set(details["pins_active"])
            if details.get("pinned"):
                m.pins_inserted.labels(agent=label).inc(details["pinned"])
        if details.get("pins_dropped"):
            m.pins_dropped.inc(details["pins_dropped"])
        if decision.kind == "carry":
            m.carries.labels(outcome="carried").inc()
        elif decision.verdict.endswith("reason=clean_slate"):
            m.carries.labels(outcome="clean_slate").inc()
        if decision.error is not None and decision.error not in self._failures \
                and len(self._failures) < _FAILURES_LOGGED:
            self._failures.add(decision.error)
            floor_log.error("floor rewrite failed (%s); request passed through unchanged, "
                            "further failures like this one are only counted", decision.error)
        if decision.kind == "shadow" or floor_log.isEnabledFor(logging.DEBUG):
            # Every verdict at DEBUG, pass-throughs included: why a request was not floored
            # is the question a user debugging identification asks.
            floor_log.log(logging.INFO if decision.added_to_request or decision.kind == "shadow"
                          else logging.DEBUG,
                          "floor %s (session %s, from %s, %d tokens, method %s)",
                          decision.verdict, decision.session_id, decision.source_session,
                          decision.added_tokens, decision.method,
                          extra={"verdict": decision.verdict, "session": decision.session_id})
        if decision.method is not None:
            m.identification_by(decision.method).inc()
        m.rewrites_by("none" if decision.kind == "off" else decision.kind).inc()
        if decision.capped:
            m.floor_capped.inc()
        if decision.added_to_request:
            m.tail_messages_injected.inc(decision.added_raw)
            m.tail_tokens_injected.inc(decision.added_tokens)

    def prepared(self, prepared: Prepared) -> None:
        if prepared.compaction is not None:
            self.compaction(prepared.compaction)
        if prepared.clamp is not None:
            self.clamp(prepared.clamp)

    def clamp(self, clamp: OutputClamp) -> None:
        self.metrics.output_lowered.labels(trigger=clamp.trigger).inc()
        recovery_log.info(
            "%s: session %s, output limit %d lowered to %d (window %d, prompt %d tokens by %s)",
            clamp.label, clamp.session, clamp.requested, clamp.limit, clamp.window,
            clamp.prompt_tokens, "the upstream's count" if clamp.measured else "our estimate",
            extra={"verdict": clamp.label, "session": clamp.session,
                   "requested_output": clamp.requested, "output_limit": clamp.limit,
                   "window": clamp.window})

    def compaction(self, compaction: Compaction) -> None:
        m = self.metrics
        m.compactions.labels(trigger=compaction.trigger).inc()
        m.tokens_removed.inc(compaction.tokens_removed)
        if compaction.summary is not None:
            self._summary(compaction.summary, compaction)
        if compaction.store_error is not None:
            m.store_errors.labels(store="sqlite", kind="failed").inc()
            if not self._store_failing:  # once per episode: until a summary is stored again
                self._store_failing = True
                recovery_log.warning("the summary was used but could not be stored (%s); "
                                     "storing is tried again with each new summary, further "
                                     "failures are only counted", compaction.store_error)
        elif compaction.summary is not None and self._store_failing:
            self._store_failing = False
            recovery_log.info("the compaction store takes summaries again")
        if compaction.trigger != "reused":
            recovery_log.info(
                "%s (%s): session %s, %d messages replaced, %d kept raw, about %d tokens "
                "removed, window %d", compaction.label, compaction.why, compaction.session,
                compaction.replaced, compaction.kept, compaction.tokens_removed,
                compaction.window,
                extra={"verdict": compaction.label, "reason": compaction.why,
                       "session": compaction.session, "replaced": compaction.replaced,
                       "kept": compaction.kept, "tokens_removed": compaction.tokens_removed,
                       "window": compaction.window})

    def _summary(self, attempt: SummaryAttempt, compaction: Compaction) -> None:
        m = self.metrics
        if attempt.failure != "resting":
            m.summarizer_duration.observe(attempt.seconds)
        if attempt.failure is not None:
            m.summarizer_failures.inc()
            recovery_log.warning("summarizer failed (%s: %s); dropping the %d oldest messages "
                                 "instead", attempt.failure, attempt.detail,
                                 compaction.replaced)
            return
        m.summarizer_tokens.labels(type="input").inc(attempt.prompt_tokens)
        m.summarizer_tokens.labels(type="output").inc(attempt.completion_tokens)

    def error_step(self, step: ErrorStep, model: str) -> None:
        if step.learned_window is not None:
            recovery_log.info("learned the context window of %s: %d tokens", model,
                              step.learned_window)
        self._ratio(step.learned_ratio, model)
        if step.overflow is not None:
            self.metrics.overflow.labels(outcome=step.overflow).inc()
        if step.overflow == "passthrough" and step.verdict is not None:
            recovery_log.info("context overflow passed through (%s)", step.verdict.pattern)
        elif step.overflow == "failed":
            recovery_log.warning("context overflow not recoverable: %s", step.note)
        if step.compaction is not None:
            self.compaction(step.compaction)
        if step.clamp is not None:
            self.clamp(step.clamp)

    @staticmethod
    def _ratio(ratio: float | None, model: str) -> None:
        if ratio is not None:
            recovery_log.info("learned the token ratio of %s: %.2f of its tokens per token of "
                              "our estimate (budgets use it as the margin)", model, ratio)

    def after(self, check: AfterCheck, model: str) -> None:
        m = self.metrics
        self._ratio(check.learned_ratio, model)
        if check.recovered:
            m.overflow.labels(outcome="recovered").inc()
        if check.clamped:
            m.overflow.labels(outcome="clamped").inc()
        if check.overflow == "mid_stream":
            m.overflow.labels(outcome="mid_stream").inc()
            recovery_log.warning("context overflow inside the stream, passed on (bytes had "
                                 "reached the client); the session's next request is "
                                 "compacted first")
        elif check.overflow == "silent" and check.silent is not None:
            m.overflow.labels(outcome="silent").inc()
            s = check.silent
            recovery_log.warning("silent context overflow (%s): prompt %d tokens, window %d, "
                                 "our estimate %s; the session's next request is compacted "
                                 "first", s.kind, s.prompt_tokens, s.window, s.estimate)

    def usage(self, usage: Usage | None, model: str, agent: str | None,
              route: str = "chat_completions") -> None:
        m = self.metrics
        if usage is None:
            m.usage_missing.labels(route=route).inc()
            return
        m.model_label.admit(model)  # an upstream answered for it: a real model name
        key = (m.model_label(model), m.agent_label(agent or "none"), route)
        counters = self._token_counters.get(key)
        if counters is None:
            # The four series of one (model, agent, route), looked up once: four label
            # lookups per answer cost more than the increments.
            counters = self._token_counters[key] = tuple(
                m.tokens_by(key[0], key[1], kind, route)
                for kind in ("input", "output", "cached_input", "reasoning"))
        for counter, value in zip(counters, (usage.input_tokens, usage.completion_tokens,
                                             usage.cached_tokens, usage.reasoning_tokens),
                                  strict=True):
            if value:
                counter.inc(value)

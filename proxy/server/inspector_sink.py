"""The recorder's hand-off to the inspector: what a finished request did, kept by reference.

The request path pays for a few attribute reads, a view of the trail without its context
(so the request's headers, its credential, are not kept), and an estimate of the memory the
view holds; the ``RequestReport``, and every digest and rendering, is made only when a page
asks. Message text stays referenced (not copied) until the budget evicts the request, and
is shown only with ``--inspect-content``.
"""

from __future__ import annotations

import time

from proxy.identity.identify import RequestSignals
from proxy.identity.lineage import Lineage
from proxy.inspector.store import CLEAN_SLATE, UNIDENTIFIED, Entry, InspectorStore
from proxy.report import RequestReport
from proxy.server.reports import report_of
from proxy.server.trail import Trail
from proxy.values import frozen_value

__all__ = ["InspectorSink", "KeptTrail"]


@frozen_value
class _Context:
    """The part of a request's context a report reads: no headers."""

    signals: RequestSignals
    lineage: Lineage
    window: int


class KeptTrail:
    """A finished trail's references without its context: what ``report_of`` reads."""

    __slots__ = ("after", "at", "attempts", "chat", "client_gone", "client_traceparent",
                 "ctx", "decision", "finish_reason", "outgoing", "proxy_seconds",
                 "request_id", "response_model", "seconds", "started", "status", "steps",
                 "stream", "trace", "usage", "verdict")

    def __init__(self, trail: Trail, seconds: float) -> None:
        ctx = trail.ctx
        self.ctx = _Context(ctx.signals, ctx.lineage, ctx.window) if ctx is not None else None
        self.request_id, self.at, self.started = trail.request_id, trail.at, trail.started
        self.chat, self.decision, self.outgoing = trail.chat, trail.decision, trail.outgoing
        self.steps, self.attempts, self.stream = trail.steps, trail.attempts, trail.stream
        self.usage, self.finish_reason, self.after = trail.usage, trail.finish_reason, \
            trail.after
        self.response_model = trail.response_model
        self.proxy_seconds, self.status = trail.proxy_seconds, trail.status
        self.client_gone, self.client_traceparent = trail.client_gone, \
            trail.client_traceparent
        self.trace = trail.trace
        self.verdict: str = trail.verdict
        self.seconds = seconds

    def __call__(self) -> RequestReport:
        """The report (``Entry.report``), made when a page asks."""
        return report_of(self, self.seconds)


_CLEAN_SLATE = f"reason={CLEAN_SLATE}"
# Beside the bodies: the trail, its context, decision and attempts, the report made from it.
_TRAIL_BYTES = 8192
_MESSAGE_BYTES = 512  # a parsed message's dict and small values, beside its text


class InspectorSink:
    """A ``TrailSink`` in front of the inspector's store."""

    def __init__(self, store: InspectorStore) -> None:
        self.store = store

    def keep_trail(self, trail: Trail) -> None:
        seconds = time.perf_counter() - trail.started
        chat, ctx, decision, outgoing = trail.chat, trail.ctx, trail.decision, trail.outgoing
        sid = method = None
        agent = chat.agent_id
        if ctx is not None:
            signals = ctx.signals
            sid, method, agent = ctx.lineage.session_id, ctx.lineage.method, signals.agent_id
            if sid is None and signals.session_source is not None:
                sid = signals.session_id  # named by the agent, not tied to a transcript
        if sid is None and decision is not None:
            sid = decision.session_id
        compaction = outgoing.compaction if outgoing is not None else None
        after = trail.after
        steps = trail.steps  # most requests take none: no generator made for them
        overflowed = (bool(steps) and any(step.overflow for step in steps)) or (
            after is not None and bool(after.overflow or after.recovered or after.clamped))
        self.store.add(Entry(
            sid or UNIDENTIFIED, trail.at, agent, method,
            decision.kind if decision is not None else "none",
            compaction is not None and not compaction.label.startswith("reused"),
            overflowed, _held(trail), KeptTrail(trail, seconds),
            decision is not None and decision.verdict.endswith(_CLEAN_SLATE)))


def _held(trail: Trail) -> int:
    """An upper estimate of the memory a kept trail holds: the client's body, its parsed
    form (the text again, and the objects around it; at least what was estimated before
    parsing it, which counts every JSON value), and a rewritten body beside it."""
    chat, outgoing = trail.chat, trail.outgoing
    raw = len(chat.raw) + len(chat.client_raw)
    sent = outgoing.body if outgoing is not None else None
    rewritten = len(sent) if sent is not None and sent is not chat.raw else 0
    messages = chat.body.get("messages")
    count = len(messages) if isinstance(messages, list) else 0
    return _TRAIL_BYTES + max(3 * raw + count * _MESSAGE_BYTES, chat.weight) + 2 * rewritten

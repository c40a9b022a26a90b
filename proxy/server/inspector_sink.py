"""The recorder's hand-off to the inspector: what a finished request did, kept by reference.

The request path pays for a few attribute reads, a view of the trail without its context
(so the request's headers, its credential, are not kept) nor its parsed messages, and an
estimate of the memory the view holds; the messages parsed again, the ``RequestReport``,
and every digest and rendering are made only when a page asks. The bodies stay referenced
(not copied) until the budget evicts the request; message text is shown only with
``--inspect-content``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Any

import orjson

from proxy.identity.identify import RequestSignals
from proxy.identity.lineage import Lineage
from proxy.inspector.store import CLEAN_SLATE, UNIDENTIFIED, Entry, InspectorStore
from proxy.report import RequestReport
from proxy.server.parsing import without_collections
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
    """A finished trail's references without its context: what ``report_of`` reads.

    Its parsed messages are not kept: each is a dict or two and their strings, objects the
    garbage collector walks in every full collection for as long as the inspector keeps the
    request (minutes, under load), while the bytes they were parsed from are one object it
    never walks. They are parsed again from those bytes when a page asks."""

    __slots__ = ("_reparse_body", "_reparse_messages", "after", "at", "attempts", "chat",
                 "client_gone", "client_traceparent", "ctx", "decision", "finish_reason",
                 "outgoing", "proxy_seconds", "request_id", "response_model", "seconds",
                 "started", "status", "steps", "stream", "trace", "usage", "verdict")

    def __init__(self, trail: Trail, seconds: float) -> None:
        ctx = trail.ctx
        self.ctx = _Context(ctx.signals, ctx.lineage, ctx.window) if ctx is not None else None
        self.request_id, self.at, self.started = trail.request_id, trail.at, trail.started
        chat, decision, outgoing = trail.chat, trail.decision, trail.outgoing
        self._reparse_body = chat.inspected and bool(chat.body)
        self.chat = replace(chat, body={}, translation=None) if self._reparse_body else chat
        self._reparse_messages = False
        if decision is not None and (decision.messages is not None or decision.added
                                     or decision.details):
            slim = replace(decision, messages=None, added=(), details={})
            if outgoing is not None and outgoing.decision is decision:
                outgoing = replace(outgoing, decision=slim)
                # with a compaction, what was sent is its messages, kept as they are
                self._reparse_messages = decision.messages is not None and \
                    outgoing.compaction is None
            decision = slim
        self.decision, self.outgoing = decision, outgoing
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
        """The report (``Entry.report``), made when a page asks, with the messages parsed
        again."""
        view = copy.copy(self)
        if self._reparse_body:
            view.chat = replace(self.chat, body=_parsed(self.chat.raw))
        outgoing = self.outgoing
        if self._reparse_messages and outgoing is not None:
            decision = outgoing.decision
            found = _parsed(decision.body).get("messages")
            again = replace(decision, messages=tuple(found) if isinstance(found, list) else ())
            view.outgoing = replace(outgoing, decision=again)
            view.decision = again
        return report_of(view, self.seconds)


def _parsed(raw: bytes) -> dict[str, Any]:
    """``raw`` parsed again, with the collector paused as for the request's own parse (it
    makes as many objects, in the page's worker thread)."""
    try:
        with without_collections():
            body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


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
    parsing it, which counts every JSON value), and a rewritten body beside it. The parsed
    form is not kept (``KeptTrail``), but a page makes it again while it renders: counting
    it bounds that too."""
    chat, outgoing = trail.chat, trail.outgoing
    raw = len(chat.raw) + len(chat.client_raw)
    sent = outgoing.body if outgoing is not None else None
    rewritten = len(sent) if sent is not None and sent is not chat.raw else 0
    messages = chat.body.get("messages")
    count = len(messages) if isinstance(messages, list) else 0
    return _TRAIL_BYTES + max(3 * raw + count * _MESSAGE_BYTES, chat.weight) + 2 * rewritten

"""The recorder's hand-off to the inspector: a finished request's trail, kept by reference
until it is settled.

The request path pays for a few attribute reads and an estimate of the memory the trail
holds. Within ``SETTLE_AFTER`` seconds, in one batch on the event loop, each kept request is settled
(``proxy.inspector.digest``): its report made and the trail let go, so neither the request's
headers (credentials) nor, with content off, any message text stays in memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace

from proxy.inspector.digest import digests
from proxy.inspector.store import UNIDENTIFIED, Entry, InspectorStore
from proxy.report import RequestReport
from proxy.server.reports import report_of
from proxy.server.trail import Trail

__all__ = ["SETTLE_AFTER", "InspectorSink"]

SETTLE_AFTER = 0.25  # seconds a finished request's trail is held before it is settled
log = logging.getLogger("tailfloor.inspector")


class _Kept:
    """A kept request's report: made from its trail at the first ask or when settled, the
    trail dropped then. Callable, as ``Entry.report``."""

    __slots__ = ("_content", "_report", "_trail")

    def __init__(self, trail: Trail, seconds: float, content: bool) -> None:
        self._trail: tuple[Trail, float] | None = (trail, seconds)
        self._report: RequestReport | None = None
        self._content = content

    def __call__(self) -> RequestReport:
        report = self._report
        return report if report is not None else self.settle()

    def settle(self) -> RequestReport:
        held = self._trail
        if held is None:  # settled meanwhile by another thread
            assert self._report is not None
            return self._report
        try:
            report = report_of(*held, body=False, digest=None if self._content else digests)
        except Exception:  # messages no digest can read: kept without them
            report = replace(report_of(*held, body=False), messages=None, origins=None)
        self._report = report
        self._trail = None
        return report

# Beside the bodies: the trail, its context, decision and attempts, the report made from it.
_TRAIL_BYTES = 8192
_MESSAGE_BYTES = 512  # a parsed message's dict and small values, beside its text


class InspectorSink:
    """A ``TrailSink`` in front of the inspector's store."""

    def __init__(self, store: InspectorStore, *, content: bool = False) -> None:
        self.store = store
        self._content = content
        self._pending: deque[_Kept] = deque()
        self._settling = False

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
        overflowed = any(step.overflow for step in trail.steps) or (
            after is not None and bool(after.overflow or after.recovered or after.clamped))
        self.store.add(Entry(
            sid or UNIDENTIFIED, trail.at, agent, method,
            decision.kind if decision is not None else "none",
            compaction is not None and not compaction.label.startswith("reused"),
            overflowed, _held(trail), self._hold(trail, seconds)))

    def _hold(self, trail: Trail, seconds: float) -> _Kept:
        kept = _Kept(trail, seconds, self._content)
        self._pending.append(kept)
        if not self._settling:
            self._settling = True
            asyncio.get_running_loop().call_later(SETTLE_AFTER, self._settle_now)
        return kept

    def _settle_now(self) -> None:
        # On the loop, not in a worker: a settle is a few microseconds of work per request
        # (messages hashed by their edges), less than handing it to a thread costs.
        try:
            self.settle_all()
        except Exception as exc:  # a bug here costs the inspector's view, never a request
            log.error("settling kept requests failed (%s: %s)", type(exc).__name__,
                      str(exc)[:200])
        finally:
            self._settling = bool(self._pending)
            if self._settling:
                asyncio.get_running_loop().call_later(SETTLE_AFTER, self._settle_now)

    def settle_all(self) -> None:
        """Settle every request kept so far."""
        while self._pending:
            try:
                kept = self._pending.popleft()
            except IndexError:
                break
            kept.settle()


def _held(trail: Trail) -> int:
    """An upper estimate of the memory a kept trail holds: the client's body, its parsed
    form (the text again, and the objects around it), and a rewritten body beside it."""
    chat, outgoing = trail.chat, trail.outgoing
    raw = len(chat.raw) + len(chat.client_raw)
    sent = outgoing.body if outgoing is not None else None
    rewritten = len(sent) if sent is not None and sent is not chat.raw else 0
    messages = chat.body.get("messages")
    count = len(messages) if isinstance(messages, list) else 0
    return _TRAIL_BYTES + 3 * raw + 2 * rewritten + count * _MESSAGE_BYTES

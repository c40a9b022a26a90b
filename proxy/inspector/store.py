"""The requests the inspector keeps: the last few of each session, within one memory budget.

``keep`` runs on the event loop for every request, so it only stores the report (by
reference) with an estimate of the memory it holds, and counts; everything shown is worked out
when a page asks (``proxy.inspector.facts``). The budget is for all sessions together: past it,
the oldest requests of the least recently active sessions go first, and a session left with
none goes with them, so neither a flood of new sessions nor one huge request can grow it.
Pure: no I/O.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from proxy.report import RequestReport

__all__ = ["UNIDENTIFIED", "InspectorStore", "Kept", "SessionRecord", "held_bytes"]

# Requests tailfloor could not tie to a session are kept together under this name.
UNIDENTIFIED = "unidentified"
# What a kept report costs beside its body: the report, its attempts, the deque slot, and a
# parsed message (a dict, its keys and small values) beside the text it shares with the body.
_REPORT_BYTES = 4096
_MESSAGE_BYTES = 512


def held_bytes(report: RequestReport) -> int:
    """An upper estimate of the memory a kept report holds: its body, and the parsed messages
    (their text again, and the objects around it)."""
    messages = report.messages
    count = len(messages) if messages is not None else 0
    body = report.body
    text = len(body) if body is not None else _texts(messages)
    return _REPORT_BYTES + count * _MESSAGE_BYTES + (2 * text if messages else text)


def _texts(messages: object) -> int:
    """Characters of text in messages with no body to measure them by (rare: a request
    that failed before it was made)."""
    if not isinstance(messages, (list, tuple)):
        return 0
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content) * 4  # a str of any code point, as UTF-32 at worst
        elif isinstance(content, list):
            total += sum(len(str(part)) * 4 for part in content)
    return total


@dataclass(slots=True)
class Kept:
    report: RequestReport
    bytes: int


@dataclass(slots=True)
class SessionRecord:
    """One session's kept requests (oldest first) and counts of what happened to it while
    tailfloor kept it."""

    session_id: str
    requests: deque[Kept] = field(default_factory=deque)
    agent: str | None = None
    source: str | None = None  # how the session was identified (the last request's method)
    last: float = 0.0  # wall-clock time of the last request
    seen: int = 0
    floors: int = 0
    carries: int = 0
    compactions: int = 0
    overflows: int = 0


class InspectorStore:
    """A ``ReportSink``: the recorder hands it every finished request."""

    def __init__(self, per_session: int, budget: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.per_session = per_session
        self.budget = budget
        self.held = 0  # the estimate of every kept report together
        self.clock = clock
        # Least recently active first: a session moves to the end with each request.
        self._sessions: OrderedDict[str, SessionRecord] = OrderedDict()

    def keep(self, report: RequestReport) -> None:
        # The session tailfloor tied it to, else the one the agent named (a header, a cache
        # key) even when tailfloor could not tie that name to a transcript.
        sid = report.session_id or report.named_session or UNIDENTIFIED
        sessions = self._sessions
        record = sessions.get(sid)
        if record is None:
            record = sessions[sid] = SessionRecord(sid)
        else:
            sessions.move_to_end(sid)
        record.seen += 1
        record.last = report.at
        record.agent = report.agent or record.agent
        record.source = report.method or record.source
        kind = report.floor_kind
        if kind == "floor":
            record.floors += 1
        elif kind == "carry":
            record.carries += 1
        if report.compaction is not None and report.compaction != "reused":
            record.compactions += 1
        if report.overflow is not None:
            record.overflows += 1
        size = held_bytes(report)
        record.requests.append(Kept(report, size))
        self.held += size
        if len(record.requests) > self.per_session:
            self.held -= record.requests.popleft().bytes
        if self.held > self.budget:
            self._shed()

    def _shed(self) -> None:
        sessions = self._sessions
        while self.held > self.budget and sessions:
            sid, record = next(iter(sessions.items()))
            self.held -= record.requests.popleft().bytes
            if not record.requests:
                del sessions[sid]

    def sessions(self) -> Iterator[SessionRecord]:
        """Most recently active first."""
        return reversed(list(self._sessions.values()))

    def session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    def __len__(self) -> int:
        return len(self._sessions)

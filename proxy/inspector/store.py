"""The requests the inspector keeps: the last few of each session, within one memory budget.

``add`` runs on the event loop for every request, so it only stores an ``Entry``: a few
counts, an estimate of the memory the request holds, and how to make its report, which is
made, with everything shown, only when a page asks (``proxy.inspector.facts``). The budget
is for all sessions together: past it, the oldest requests of the least recently active
sessions go first, and a session left with none goes with them, so neither a flood of new
sessions nor one huge request can grow it.
Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from proxy.report import RequestReport

__all__ = ["CLEAN_SLATE", "UNIDENTIFIED", "Entry", "InspectorStore", "SessionRecord", "entry_of",
           "held_bytes"]

# Requests tailfloor could not tie to a session are kept together under this name.
UNIDENTIFIED = "unidentified"
CLEAN_SLATE = "clean_slate"  # the floor's pass-through reason for a session begun clean
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


class Entry(NamedTuple):
    """One finished request as the store indexes it: what the sessions list counts, the
    memory it holds, and how to make its report when a page asks (``report``: the request
    path builds none)."""

    session_id: str
    at: float
    agent: str | None
    method: str | None
    floor_kind: str
    compacted: bool  # tailfloor compacted it (reusing a stored summary does not count)
    overflowed: bool
    bytes: int
    report: Callable[[], RequestReport]
    clean_slate: bool = False  # its floor passed because the user asked for a clean slate


def entry_of(report: RequestReport) -> Entry:
    """An already made report as an entry."""
    return Entry(report.session_id or report.named_session or UNIDENTIFIED, report.at,
                 report.agent, report.method, report.floor_kind,
                 report.compaction is not None and not report.compaction.startswith("reused"),
                 report.overflow is not None, held_bytes(report), lambda: report,
                 report.floor_reason == CLEAN_SLATE)


@dataclass(slots=True)
class SessionRecord:
    """One session's kept requests (oldest first) and counts of what happened to it while
    tailfloor kept it."""

    session_id: str
    requests: deque[Entry] = field(default_factory=deque)
    agent: str | None = None
    source: str | None = None  # how the session was identified (the last request's method)
    last: float = 0.0  # wall-clock time of the last request
    seen: int = 0
    floors: int = 0
    carries: int = 0
    compactions: int = 0
    overflows: int = 0
    # a request of it passed the floor because its first user message asked for a clean
    # slate: the session started with nothing of its predecessor, by the user's choice
    clean_slate: bool = False


class InspectorStore:
    """The kept requests; also a ``ReportSink`` (``keep``) for reports already made."""

    def __init__(self, per_session: int, budget: int) -> None:
        self.per_session = per_session
        self.budget = budget
        self.held = 0  # the estimate of every kept report together
        # Least recently active first: a session moves to the end with each request.
        self._sessions: OrderedDict[str, SessionRecord] = OrderedDict()

    def keep(self, report: RequestReport) -> None:
        self.add(entry_of(report))

    def add(self, entry: Entry) -> None:
        sid = entry.session_id
        sessions = self._sessions
        record = sessions.get(sid)
        if record is None:
            record = sessions[sid] = SessionRecord(sid)
        else:
            sessions.move_to_end(sid)
        record.seen += 1
        record.last = entry.at
        if entry.agent is not None:
            record.agent = entry.agent
        if entry.method is not None:
            record.source = entry.method
        kind = entry.floor_kind
        if kind == "floor":
            record.floors += 1
        elif kind == "carry":
            record.carries += 1
        if entry.compacted:
            record.compactions += 1
        if entry.overflowed:
            record.overflows += 1
        if entry.clean_slate:
            record.clean_slate = True
        requests = record.requests
        requests.append(entry)
        self.held += entry.bytes
        if len(requests) > self.per_session:
            self.held -= requests.popleft().bytes
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

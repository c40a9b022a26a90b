"""Records the catalog hands out: session metadata and tail messages. Frozen, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from proxy.transcripts.entries import Entry

__all__ = [
    "CompactionInfo",
    "Era",
    "LinkKind",
    "Pick",
    "ResetMark",
    "SessionInfo",
    "SessionRecord",
    "SourceKind",
    "TailMessage",
    "TranscriptStore",
    "Window",
]

SourceKind = Literal["pi", "openclaw-jsonl", "openclaw-sqlite"]
# Which of a tail's entries to read, given them and the context edits that replace any.
Pick = Callable[[Sequence[Entry], Mapping[str, Entry]], list[Entry]]
# pi: Pi's own files. openclaw-2026.7: JSONL + sessions.json (reset renames the file).
# openclaw-2026.9: SQLite (reset appends a reset entry, expiry links session_windows).
Era = Literal["pi", "openclaw-2026.7", "openclaw-2026.9"]
# How a session was linked to its predecessor.
LinkKind = Literal["reset_archive", "reset_entry", "session_windows", "key_history",
                   "pi_directory", "parent_session"]


@dataclass(frozen=True, slots=True)
class CompactionInfo:
    """The last compaction on the active branch."""

    entry_id: str
    summary: str
    first_kept_id: str | None
    timestamp: float | None


@dataclass(frozen=True, slots=True)
class ResetMark:
    """A ``reset`` entry: everything before it is hidden from the model (same session id)."""

    entry_id: str
    timestamp: float | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What an adapter knows about a session apart from its entries."""

    session_id: str
    source: SourceKind
    era: Era
    location: str
    agent_id: str | None = None
    session_key: str | None = None
    created: float | None = None
    cwd: str | None = None
    predecessor: str | None = None
    link: LinkKind | None = None
    ended: bool = False
    group: str | None = None  # Pi: the session directory; predecessors are looked up in it
    # OpenClaw: the agent directory (<state>/agents/<id>). Session keys are only unique
    # within one, so key lookups and key-history links never cross scopes.
    scope: str | None = None
    # The --sessions root (resolved) the transcript lies under: each root is a tenant.
    root: str | None = None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """Metadata of one session as the catalog sees it now (no message content)."""

    info: SessionInfo
    updated: float | None
    message_count: int
    count_complete: bool
    compaction: CompactionInfo | None
    resets: tuple[ResetMark, ...]
    predecessor: str | None
    link: LinkKind | None

    @property
    def session_id(self) -> str:
        return self.info.session_id

    @property
    def agent_id(self) -> str | None:
        return self.info.agent_id

    @property
    def session_key(self) -> str | None:
        return self.info.session_key

    @property
    def source(self) -> SourceKind:
        return self.info.source

    def summary(self) -> dict[str, Any]:
        """JSON-ready metadata (what GET /tailfloor/sessions and ``sessions --json`` show)."""
        comp = self.compaction
        return {
            "session_id": self.session_id, "agent_id": self.agent_id,
            "session_key": self.session_key, "source": self.source, "era": self.info.era,
            "location": self.info.location, "created": self.info.created,
            "updated": self.updated, "message_count": self.message_count,
            "message_count_complete": self.count_complete, "ended": self.info.ended,
            "predecessor": self.predecessor, "predecessor_link": self.link,
            "compaction": None if comp is None else {
                "entry_id": comp.entry_id, "first_kept_id": comp.first_kept_id,
                "timestamp": comp.timestamp},
            "resets": [{"entry_id": r.entry_id, "timestamp": r.timestamp, "reason": r.reason}
                       for r in self.resets],
        }


@dataclass(frozen=True, slots=True)
class TailMessage:
    """One raw transcript message and the OpenAI message(s) the agent renders it as."""

    entry_id: str
    timestamp: float | None
    role: str
    # What readers need of the transcript's object besides its rendering
    # (``loading.framing``): not its content, the bulk of a kept rendering otherwise.
    framing: Mapping[str, Any]
    messages: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Window:
    """The last entries of a transcript in file order; ``complete`` when it starts at the top."""

    entries: Sequence[Entry]
    complete: bool
    marks: Sequence[Entry] = field(default_factory=tuple)
    end: int = -1  # where following continues: byte offset (JSONL) or last seq (SQLite)


class TranscriptStore(Protocol):
    """Re-reads a transcript on demand (the catalog keeps no message content)."""

    def load(self, entries: Sequence[Entry]) -> list[Mapping[str, Any] | None]:
        """The raw JSON objects of these entries (None where one can no longer be read)."""
        ...

    def read_window(self, min_messages: int | None) -> Window:
        """The last entries holding at least ``min_messages`` raw messages (None: all)."""
        ...

    # Optional: ``read_marks(before: int) -> Sequence[Entry]``, the compaction and reset
    # entries positioned before ``before``; used once per session whose window does not
    # reach the top, so its record knows the last compaction.

"""The demo's scripted material: a Pi session transcript (JSONL, Pi's format: a session
header, then message, compaction and other entries linked by ``parentId``) and the requests
Pi would send over it. Deterministic: ids and times are derived from counters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MODEL", "SYSTEM", "PiSession", "overflow_conversation", "pi_messages"]

MODEL = "smollm2"
SYSTEM = ("You are a terse assistant for the data team. Current date: 2026-12-01. Current "
          "working directory: /home/dev/export")
PREFIX = ("The conversation history before this point was compacted into the following "
          "summary:\n\n<summary>\n")
_BASE_MS = 1_796_000_000_000
_PROSE = ("The nightly export reads the orders table, writes parquet files to the shared "
          "bucket and posts a short report to the team channel. When the warehouse is busy "
          "the export waits for a lock and sometimes gives up. ")


@dataclass
class PiSession:
    """One Pi session file being written, entry by entry."""

    session_id: str
    path: Path
    entries: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write({"type": "session", "version": 3, "id": self.session_id,
                     "timestamp": "2026-12-01T09:00:00.000Z", "cwd": "/home/dev/export"})

    def _write(self, entry: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    def _add(self, kind: str, **fields: Any) -> str:
        entry_id = f"{self.session_id[:4]}{len(self.entries):04x}"
        parent = self.entries[-1]["id"] if self.entries else None
        when = _BASE_MS + 1000 * (len(self.entries) + 1)
        entry = {"type": kind, "id": entry_id, "parentId": parent, "timestamp": when, **fields}
        self.entries.append(entry)
        self._write(entry)
        return entry_id

    def user(self, text: str) -> str:
        when = _BASE_MS + 1000 * (len(self.entries) + 1)
        return self._add("message", message={"role": "user", "timestamp": when,
                                             "content": [{"type": "text", "text": text}]})

    def assistant(self, text: str) -> str:
        return self._add("message", message={"role": "assistant", "stopReason": "stop",
                                             "content": [{"type": "text", "text": text}]})

    def compaction(self, summary: str, first_kept_id: str) -> str:
        return self._add("compaction", summary=summary, firstKeptEntryId=first_kept_id,
                         tokensBefore=4000)


def turns(count: int) -> list[tuple[str, str]]:
    """A conversation about a flaky export job, one (user, assistant) pair per turn."""
    topics = ["the job's config in /etc/export/nightly.toml", "the lock timeout",
              "yesterday's failed run", "the parquet writer", "the report step",
              "the retry policy", "the warehouse load", "the alert rule"]
    return [(f"Turn {i + 1}, about {topics[i % len(topics)]}: " + _PROSE * 2,
             f"Noted: {topics[i % len(topics)]}.") for i in range(count)]


def pi_messages(summary: str, kept: list[tuple[str, str]], question: str
                ) -> list[dict[str, Any]]:
    """What Pi sends after its compaction: system prompt, summary, kept turns, question."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": PREFIX + summary + "\n</summary>"},
            *[m for user, reply in kept for m in ({"role": "user", "content": user},
                                                  {"role": "assistant", "content": reply})],
            {"role": "user", "content": question}]


def overflow_conversation() -> list[dict[str, Any]]:
    """A conversation past the demo's window by the server's count, its last user message
    long (the raw tail stays, what goes before it fits one summarizer call)."""
    return [{"role": "system", "content": "You are a helpful assistant for the data team."},
            {"role": "user", "content": "Our export job is flaky. " + _PROSE * 8},
            {"role": "assistant", "content": "Please describe the job."},
            {"role": "user", "content": "The job: " + _PROSE * 8},
            {"role": "assistant", "content": "I see no failure yet."},
            {"role": "user", "content": "Recent logs: " + _PROSE * 19},
            {"role": "assistant", "content": "Still normal."},
            {"role": "user", "content": "The error was ERR_EXPORT_TIMEOUT. What now?"}]

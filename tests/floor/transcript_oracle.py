"""The transcripts' messages in order, read here from the formats as their docs describe them,
without tailfloor's readers: the replay tests check what the floor put back against this.

Pi and OpenClaw JSONL, and OpenClaw's SQLite ``transcript_events``, hold one JSON entry per
line or row; entries link to their parent by ``parentId`` and the live branch is the chain
from the last entry written back to the root. A ``<file>.jsonl.reset.<stamp>`` archive holds
a session's entries from before a reset under the same id. Messages are ``type: message``
entries; ``toolResult`` is the wire's ``tool`` role. Pi 1.x keeps its system prompt as a
``system`` message: it goes out as the request's own system prompt, not as conversation.

A message is known by what both sides must keep: its role, its text, and the ids of the tool
calls it makes or answers. The agents add a line of their own to a user message on the wire
(OpenClaw's time prefix and Runtime line), so a wire message is matched to the transcript's
when its text holds the transcript's. An answer that ended in an error is in the transcript
but no agent sends it again (its ``stopReason`` says so).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import zstandard


@dataclass(frozen=True)
class Said:
    role: str
    text: str
    calls: tuple[str, ...]
    written: float = 0.0  # the entry's time, for what stood before a request
    failed: bool = False  # an answer that ended in an error: no agent sends it again
    segment: int = 0  # resets before it: OpenClaw's ``reset`` entry hides what came before


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(p["text"] for p in content
                     if isinstance(p, dict) and p.get("type") in ("text", "input_text")
                     and isinstance(p.get("text"), str))


def _id(value: Any) -> str:
    # OpenClaw keeps a tool call's id as the model gave it and sends it with only its
    # letters and digits ("call_ee68..." goes out as "callee68...").
    return "".join(ch for ch in str(value) if ch.isalnum())


def from_transcript(message: dict[str, Any]) -> Said:
    role = message.get("role", "")
    content = message.get("content")
    if role == "toolResult":
        return Said("tool", _texts(content), (_id(message.get("toolCallId")),))
    calls = tuple(_id(p.get("id")) for p in content or () if isinstance(p, dict)
                  and p.get("type") == "toolCall") if isinstance(content, list) else ()
    failed = role == "assistant" and message.get("stopReason") in ("error", "aborted")
    return Said(role, _texts(content), calls, failed=failed)


def from_wire(message: dict[str, Any]) -> Said:
    role = message.get("role", "")
    if role == "tool":
        return Said("tool", _texts(message.get("content")), (_id(message.get("tool_call_id")),))
    calls = tuple(_id(c.get("id")) for c in message.get("tool_calls") or ())
    return Said(role, _texts(message.get("content")), calls)


def same(wire: Said, kept: Said) -> bool:
    text = kept.text.strip()
    return (wire.role == kept.role and wire.calls == kept.calls and text in wire.text
            and bool(text) == bool(wire.text.strip()))


def _chain(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live branch: from the last entry with an id back to the root, oldest first."""
    by_id = {e["id"]: e for e in entries if isinstance(e.get("id"), str)}
    linked = [e for e in entries if isinstance(e.get("id"), str) and e.get("type") != "session"]
    out: list[dict[str, Any]] = []
    at = linked[-1] if linked else None
    while at is not None:
        out.append(at)
        at = by_id.get(at.get("parentId") or "")
    return out[::-1]


def _time(entry: dict[str, Any]) -> float:
    stamp = entry.get("timestamp")
    return datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else 0.0


def _jsonl(path: Path) -> tuple[str, list[dict[str, Any]]]:
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    header = next(e for e in entries if e.get("type") == "session")
    return header["id"], entries


def _sqlite(path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    unzip = zstandard.ZstdDecompressor()
    try:
        rows = conn.execute("SELECT session_id, event_json, event_zstd FROM transcript_events "
                            "ORDER BY session_id, seq").fetchall()
    finally:
        conn.close()
    sessions: dict[str, list[dict[str, Any]]] = {}
    for sid, text, blob in rows:
        raw = text if text is not None else unzip.decompress(blob, max_output_size=1 << 24)
        sessions.setdefault(sid, []).append(json.loads(raw))
    yield from sessions.items()


def messages_by_session(root: Path) -> dict[str, list[Said]]:
    """Every session under ``root``: its messages on the live branch, archives first."""
    parts: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
    for path in sorted(root.rglob("*")):
        name = path.name
        if ".jsonl.reset." in name:
            sid, entries = _jsonl(path)
            parts.setdefault(sid, []).append((0, entries))
        elif name.endswith(".jsonl"):
            sid, entries = _jsonl(path)
            parts.setdefault(sid, []).append((1, entries))
        elif name.endswith(".sqlite"):
            for sid, entries in _sqlite(path):
                parts.setdefault(sid, []).append((1, entries))
    out = {}
    for sid, pieces in parts.items():
        said, segment = [], 0
        for _order, entries in sorted(pieces, key=lambda p: p[0]):
            for e in _chain(entries):
                if e.get("type") == "reset":
                    segment += 1
                elif (e.get("type") == "message" and isinstance(e.get("message"), dict)
                      and e["message"].get("role") != "system"):
                    said.append(replace(from_transcript(e["message"]), written=_time(e),
                                        segment=segment))
            segment += 1
        out[sid] = said
    return out


def run_in(wire: list[dict[str, Any]], kept: list[Said]) -> int | None:
    """Where ``wire`` stands in ``kept`` as one unbroken run (an answer that failed may lie
    between two of its messages, as the agents leave it out too); None when it does not."""
    said = [from_wire(m) for m in wire]
    live = [i for i, k in enumerate(kept) if not k.failed]
    for start in range(len(live) - len(said) + 1):
        if all(same(w, kept[live[start + j]]) for j, w in enumerate(said)):
            return live[start]
    return None

"""Putting back the raw messages a compaction swallowed. Pure.

The request's first raw message after the agent's summary (the *anchor*) is located in the
session's rendered tail by content; the messages before it are what the summary replaced.
The ``n`` raw messages before the anchor are restored (not just the shortfall, so that the
restored block stays the same from one request to the next while the anchor stays put, and
the upstream's prompt cache keeps hitting), extended back to a legal boundary: never a tool
result without its call, tool exchanges whole.

Comparing a request message with a transcript rendering ignores what agents change on the
wire: OpenClaw's timestamp prefix and Runtime suffix, whitespace, and the tool-call id form
(OpenClaw drops ``_``, Pi may normalise). The restored messages themselves use the tool-id
form the request shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.boundary import legal_starts, units
from proxy.identify import INTERNAL_CONTEXT, OPENCLAW_CONTINUE, message_text
from proxy.transcripts.entries import normalise_user_text
from proxy.transcripts.records import TailMessage

__all__ = ["Block", "adapt_ids", "flatten", "is_counted", "plan_restore", "wire_key"]

_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")
# OpenClaw 2026.7 glues a failed turn's placeholder onto the reply that follows it on the wire.
FAILED_TURN = "[assistant turn failed before producing content]"
Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Block:
    """Messages to add, as units kept or dropped whole (oldest first)."""

    units: tuple[tuple[Message, ...], ...]
    newest_ts: float | None = None  # time of the newest message added

    @property
    def messages(self) -> list[Message]:
        return [m for unit in self.units for m in unit]


def _id_key(value: object) -> str:
    return _NOT_ALNUM.sub("", value.split("|", 1)[0]) if isinstance(value, str) else ""


def is_internal(message: object) -> bool:
    """OpenClaw's trailing internal-context message or its overflow "Continue" turn."""
    if not isinstance(message, Mapping) or message.get("role") != "user":
        return False
    text = normalise_user_text(message_text(message))
    return text.startswith(INTERNAL_CONTEXT) or text.startswith(OPENCLAW_CONTINUE)


def is_counted(message: object) -> bool:
    """A raw message of the conversation (what the floor counts)."""
    return (isinstance(message, Mapping) and message.get("role") in ("user", "assistant", "tool")
            and not is_internal(message))


def wire_key(message: object) -> tuple[Any, ...]:
    """What a message says, independent of how an agent decorates it on the wire."""
    if not isinstance(message, Mapping):
        return ("?",)
    role = message.get("role")
    text = " ".join(normalise_user_text(message_text(message)).split())
    if role == "assistant":
        text = text.replace(FAILED_TURN, "").strip()
        calls = message.get("tool_calls")
        ids = tuple(_id_key(c.get("id")) for c in calls if isinstance(c, Mapping)) \
            if isinstance(calls, list) else ()
        return ("assistant", text, ids)
    if role == "tool":
        return ("tool", _id_key(message.get("tool_call_id")), text)
    return (str(role), text)


def flatten(tail: Sequence[TailMessage]) -> tuple[list[Message], list[float | None]]:
    """The rendered messages of tail records, in order, with each one's entry time."""
    out: list[Message] = []
    times: list[float | None] = []
    for record in tail:
        for message in record.messages:
            out.append(message)
            times.append(record.timestamp)
    return out, times


def adapt_ids(messages: Sequence[Message], strip_underscore: bool | None) -> list[Message]:
    """Restored messages with tool-call ids in the request's form (OpenClaw strips ``_``)."""
    if not strip_underscore:
        return list(messages)
    out: list[Message] = []
    for message in messages:
        m = message
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            m = {**m, "tool_calls": [{**c, "id": c["id"].replace("_", "")}
                                     if isinstance(c, dict) and isinstance(c.get("id"), str)
                                     else c for c in m["tool_calls"]]}
        elif m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
            m = {**m, "tool_call_id": m["tool_call_id"].replace("_", "")}
        out.append(m)
    return out


def find_anchor(rendered: Sequence[Message], own: Sequence[Any]) -> int | None:
    """Index in ``rendered`` of the request's first raw message (the longest, then latest,
    agreeing run), or None when the transcript does not hold it."""
    mine = [wire_key(m) for m in own if not is_internal(m)]
    if not mine:
        return None
    keys = [wire_key(m) for m in rendered]
    best: tuple[int, int] | None = None
    for p in range(len(keys) - 1, -1, -1):
        if keys[p] != mine[0]:
            continue
        run = 1
        while run < len(mine) and p + run < len(keys) and keys[p + run] == mine[run]:
            run += 1
        if best is None or run > best[0]:
            best = (run, p)
    return None if best is None else best[1]


def legal_block(before: Sequence[Message], own: Sequence[Any], n: int) -> int:
    """Start in ``before`` of the last ``n`` counted messages, moved back to a legal start of
    ``before + own`` (``len(before)``: nothing to add)."""
    if n <= 0 or not before:
        return len(before)
    combined = [*before, *own]
    starts = [s for s in legal_starts(combined) if s < len(before)]
    if not starts:
        return len(before)
    seen = 0
    position = len(before)
    for s in reversed(starts):
        seen += sum(1 for m in before[s:position] if is_counted(m))
        position = s
        if seen >= n:
            return s
    return starts[0]


def to_units(block: Sequence[Message], own: Sequence[Any]) -> tuple[tuple[Message, ...], ...]:
    """Split added messages into units (tool exchanges whole), judged with what follows."""
    combined = [*block, *own]
    out = []
    for unit in units(combined):
        if unit.start >= len(block):
            break
        out.append(tuple(block[unit.start:min(unit.end, len(block))]))
    return tuple(out)


def plan_restore(tail: Sequence[TailMessage], own: Sequence[Any], n: int,
                 strip_underscore: bool | None) -> Block | None:
    """The messages to insert before ``own`` (the request's raw messages after its summary);
    None when the transcript does not hold the request's first raw message."""
    first = next((m for m in own if not is_internal(m)), None)
    if not isinstance(first, Mapping) or first.get("role") == "tool":
        return None  # a block ending inside a tool exchange could not be dropped whole
    rendered, times = flatten(tail)
    anchor = find_anchor(rendered, own)
    if anchor is None:
        return None
    before = adapt_ids(rendered[:anchor], strip_underscore)
    start = legal_block(before, own, n)
    block = before[start:]
    newest = times[anchor - 1] if anchor > 0 else None
    return Block(to_units(block, own), newest)

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

import itertools
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from proxy.floor.style import Prefix, learn_prefix, restyle
from proxy.transcripts.records import TailMessage
from proxy.wire.boundary import legal_starts, tail_start
from proxy.wire.content import message_text
from proxy.wire.openclaw import INTERNAL_CONTEXT, OPENCLAW_CONTINUE, normalise_user_text
from proxy.wire.tool_ids import call_id_key

__all__ = ["USER_SIDE", "Block", "adapt_ids", "flatten", "is_counted", "plan_restore",
           "prefix_of", "wire_key"]

# OpenClaw 2026.7 glues a failed turn's placeholder onto the reply that follows it on the wire.
FAILED_TURN = "[assistant turn failed before producing content]"
# How far from where the request's own messages put it the anchor is looked for first (the
# transcript may lag the request, or hold a retry's duplicates once).
_NEAR = 8
_CONFIRM = 4  # agreeing messages that confirm an anchor found where it was expected
_INTERNAL_HEADS = ("[", INTERNAL_CONTEXT, OPENCLAW_CONTINUE.split(" ", 1)[0])
Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Block:
    """Messages to add, as units kept or dropped whole (oldest first)."""

    units: tuple[tuple[Message, ...], ...]
    newest_ts: float | None = None  # time of the newest message added

    @property
    def messages(self) -> list[Message]:
        return [m for unit in self.units for m in unit]


def _mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # Parsed JSON and renderings are dicts: the exact-type test spares the ABC check's cost
    # on every message the floor counts.
    return value.__class__ is dict or isinstance(value, Mapping)


def is_internal(message: object) -> bool:
    """OpenClaw's trailing internal-context message or its overflow "Continue" turn."""
    if not _mapping(message) or message.get("role") != "user":
        return False
    text = message_text(message)
    # Normalising only drops a time prefix (it starts with "["), collapses whitespace and
    # cuts a suffix that starts with whitespace: a text whose first word is neither marker's
    # nor a prefix cannot be one, and most are not (skips normalising every user message).
    if not text.lstrip().startswith(_INTERNAL_HEADS):
        return False
    text = normalise_user_text(text)
    return text.startswith(INTERNAL_CONTEXT) or text.startswith(OPENCLAW_CONTINUE)


def is_counted(message: object) -> bool:
    """A raw message of the conversation (what the floor counts)."""
    if not _mapping(message):
        return False
    role = message.get("role")
    return (role == "user" and not is_internal(message)) or role in ("assistant", "tool")


def wire_key(message: object) -> tuple[Any, ...]:
    """What a message says, independent of how an agent decorates it on the wire."""
    if not isinstance(message, Mapping):
        return ("?",)
    role = message.get("role")
    text = normalise_user_text(message_text(message))
    if role == "assistant":
        text = text.replace(FAILED_TURN, "").strip()
        calls = message.get("tool_calls")
        ids = tuple(call_id_key(c.get("id")) for c in calls if isinstance(c, Mapping)) \
            if isinstance(calls, list) else ()
        return ("assistant", text, ids)
    if role == "tool":
        return ("tool", call_id_key(message.get("tool_call_id")), text)
    return (str(role), text)


def _time_of(record: TailMessage) -> float | None:
    # The agent stamps the prefix with the message's own time (ms), not the entry's.
    inner = record.framing.get("message")
    ts = inner.get("timestamp") if _mapping(inner) else None
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        return float(ts) / 1000.0
    return record.timestamp


def flatten(tail: Sequence[TailMessage], prefix: Prefix | None = None
            ) -> tuple[list[Message], list[float | None]]:
    """The rendered messages of tail records, in order, with each one's time; user texts
    given the agent's prefix when ``prefix`` is known."""
    out: list[Message] = []
    times: list[float | None] = []
    for record in tail:
        when = _time_of(record)
        for message in record.messages:
            out.append(message)
            times.append(when)
    return restyle(out, times, prefix), times


class _Besides:
    """Every role but some (a ``roles`` filter of a catalog tail)."""

    __slots__ = ("_excluded",)

    def __init__(self, *excluded: str) -> None:
        self._excluded = excluded

    def __contains__(self, role: object) -> bool:
        return role not in self._excluded


# The raw messages that render as user messages: all but answers and tool results.
USER_SIDE: Container[str] = _Besides("assistant", "toolResult")


def prefix_of(own: Sequence[Any], tail: Sequence[TailMessage], now: float,
              tries: int | None = None) -> Prefix | None:
    """The agent's user-text prefix, learned from the request's user messages: against their
    transcript times where the transcript holds them, else the newest against ``now``.
    ``tries``: the request's user messages looked up at most (default: as many as ``tail``
    renders to; a caller that read only the users of its tail says how long it was)."""
    rendered, times = flatten(tail)
    keys = {wire_key(m): t for m, t in zip(rendered, times, strict=True)
            if m.get("role") == "user"}
    newest: Mapping[str, Any] | None = None
    tried = 0
    for message in reversed(own):
        if not isinstance(message, Mapping) or message.get("role") != "user" \
                or is_internal(message):
            continue
        newest = newest or message
        when = keys.get(wire_key(message))
        if when is not None:
            return learn_prefix([message], [when])
        tried += 1
        if tried >= (len(rendered) if tries is None else tries):
            break  # older user messages cannot be in a probe this short
    return learn_prefix([newest], [now]) if newest is not None else None


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
    """Index in ``rendered`` of the request's first raw message, or None when the transcript
    does not hold it.

    The request's own messages normally end the transcript, so the anchor is first looked
    for where their count puts it (keys computed lazily, a few per request); only when that
    fails is the whole tail searched: the longest agreeing run wins, then the latest.
    """
    mine = [m for m in own if not is_internal(m)]
    if not mine:
        return None
    theirs: dict[int, tuple[Any, ...]] = {}
    ours: dict[int, tuple[Any, ...]] = {}

    def key_at(i: int) -> tuple[Any, ...]:
        if i not in theirs:
            theirs[i] = wire_key(rendered[i])
        return theirs[i]

    def our_key(i: int) -> tuple[Any, ...]:
        if i not in ours:
            ours[i] = wire_key(mine[i])
        return ours[i]

    def run_at(p: int, limit: int) -> int:
        if rendered[p].get("role") != mine[0].get("role") or key_at(p) != our_key(0):
            return 0
        run = 1
        while run < min(len(mine), limit) and p + run < len(rendered) \
                and key_at(p + run) == our_key(run):
            run += 1
        return run

    expected = len(rendered) - len(mine)
    for delta in range(_NEAR):
        for p in sorted({expected - delta, expected + delta}):
            if 0 <= p < len(rendered) and run_at(p, _CONFIRM) >= min(
                    len(mine), len(rendered) - p, _CONFIRM):
                return p
    # Anywhere else, the match must be as convincing: a lone "hi" proves nothing.
    best: tuple[int, int] | None = None
    for p in range(len(rendered) - 1, -1, -1):
        run = run_at(p, len(mine))
        if run >= min(len(mine), len(rendered) - p, _CONFIRM) and (best is None
                                                                     or run > best[0]):
            best = (run, p)
    return None if best is None else best[1]


def legal_block(before: Sequence[Message], own: Sequence[Any], n: int,
                starts: Sequence[int] | None = None) -> int:
    """Start in ``before`` of the last ``n`` counted messages, moved back to a legal start of
    ``before + own`` (``len(before)``: nothing to add); ``starts``: that list's legal starts,
    when the caller has them."""
    if n <= 0 or not before:
        return len(before)
    if starts is None:
        starts = legal_starts([*before, *own])
    return tail_start(before, n, counts=is_counted, starts=[s for s in starts if s < len(before)])


def to_units(block: Sequence[Message], own: Sequence[Any],
             starts: Sequence[int] | None = None) -> tuple[tuple[Message, ...], ...]:
    """Split added messages into units (tool exchanges whole), judged with what follows;
    ``starts``: the legal starts of ``block + own``, when the caller has them."""
    combined = [*block, *own]
    # The bounds ``units`` splits at, without a Unit made for each (one per restored message).
    if starts is None:
        starts = legal_starts(combined)
    bounds = [0, *starts] if combined and (not starts or starts[0] > 0) else starts
    out = []
    for start, end in itertools.pairwise([*bounds, len(combined)]):
        if start >= len(block):
            break
        out.append(tuple(block[start:min(end, len(block))]))
    return tuple(out)


def plan_restore(tail: Sequence[TailMessage], own: Sequence[Any], n: int,
                 strip_underscore: bool | None, *, anchored: bool = False,
                 prefix: Prefix | None = None) -> Block | None:
    """The messages to insert before ``own`` (the request's raw messages after its summary);
    None when the transcript does not hold the request's first raw message.

    ``anchored``: ``tail`` already ends right before the request's first raw message (the
    caller read it up to the compaction's first kept entry), so no search is needed.
    """
    first = next((m for m in own if not is_internal(m)), None)
    if not isinstance(first, Mapping) or first.get("role") == "tool":
        return None  # a block ending inside a tool exchange could not be dropped whole
    rendered, times = flatten(tail, prefix)
    anchor = len(rendered) if anchored else find_anchor(rendered, own)
    if anchor is None:
        return None
    before = adapt_ids(rendered[:anchor], strip_underscore)
    newest = times[anchor - 1] if anchor > 0 else None
    if n <= 0 or not before:
        return Block((), newest)
    starts = legal_starts([*before, *own])
    start = legal_block(before, own, n, starts)
    # No tool exchange spans a legal start, so what follows it splits the same without
    # what precedes it: the block's legal starts are the list's from there on.
    return Block(to_units(before[start:], own, [s - start for s in starts if s >= start]),
                 newest)

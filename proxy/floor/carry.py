"""Carrying the previous session's tail into a new session after a reset. Pure.

The predecessor's last ``n`` raw messages (rendered the way the agent renders history) go
right after the system prompt, framed by two short notes saying where they come from and when
that session ended; the predecessor's summary, if it had one, rides in the opening note.
Messages the new session already repeats (OpenClaw 2026.9 keeps a few on automatic rollovers)
are not carried twice: the carried tail stops where the request's own messages begin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from proxy.floor.restore import (
    Block,
    adapt_ids,
    flatten,
    is_counted,
    is_internal,
    to_units,
    wire_key,
)
from proxy.floor.style import Prefix
from proxy.policy.records import Notes
from proxy.transcripts.records import TailMessage
from proxy.wire.boundary import incomplete_tool_calls, tail_start
from proxy.wire.content import message_text
from proxy.wire.openclaw import is_reset_command
from proxy.wire.summary import agent_summary

__all__ = ["CarrySource", "frame", "plan_carry", "reset_kind"]

Message = dict[str, Any]
_LINK_KINDS = {"reset_archive": "reset", "session_windows": "idle", "key_history": "idle",
               "pi_directory": "new", "parent_session": "new"}


@dataclass(frozen=True, slots=True)
class CarrySource:
    """Where carried messages come from: the predecessor and how the reset happened."""

    session_id: str
    reason: str  # a reset kind of the rules: daily, idle, new, reset
    before: str | None = None  # a reset entry of the same session: carry what it closed
    summary: str | None = None


def reset_kind(link: str | None, reason: str | None = None) -> str:
    """The rules' reset kind for a recorded link (or a reset entry's reason)."""
    if reason is not None:
        return reason if reason in ("daily", "idle", "new", "reset") else "reset"
    return _LINK_KINDS.get(link or "", "new")


def _overlap(carried: Sequence[Message], own: Sequence[Any]) -> int:
    """How many of the carried messages' last ones the request already starts with."""
    mine = [wire_key(m) for m in own if not is_internal(m)]
    keys = [wire_key(m) for m in carried]
    for k in range(min(len(keys), len(mine)), 0, -1):
        if keys[-k:] == mine[:k]:
            return k
    return 0


def _agent_made(record: TailMessage) -> bool:
    """A turn the agent answered itself (OpenClaw's reply to a command it handles), which no
    model wrote and the agent does not send to one."""
    inner = record.framing.get("message")
    return isinstance(inner, Mapping) and inner.get("role") == "assistant" \
        and inner.get("provider") == "openclaw" and inner.get("model") == "gateway-injected"


def _without_commands(tail: Sequence[TailMessage]) -> list[TailMessage]:
    """The tail without the command exchange that ended the session (``/new`` or ``/reset``
    and the agent's own answer to it): the agent's, not conversation."""
    out = list(tail)
    while out and (_agent_made(out[-1]) or (out[-1].role == "user" and any(
            is_reset_command(message_text(m)) for m in out[-1].messages))):
        out.pop()
    return out


def plan_carry(tail: Sequence[TailMessage], own: Sequence[Any], n: int,
               strip_underscore: bool | None, prefix: Prefix | None = None) -> Block:
    """The predecessor's last ``n`` raw messages, legal on their own, minus what repeats."""
    tail = _without_commands(tail)
    rendered, times = flatten(tail, prefix)
    rendered = adapt_ids(rendered, strip_underscore)
    cut = len(rendered) - _overlap(rendered, own)
    rendered, times = rendered[:cut], times[:cut]
    # A session can end inside a tool exchange (the agent died waiting for a result).
    incomplete = incomplete_tool_calls(rendered)
    if incomplete:
        rendered, times = rendered[:incomplete[0]], times[:incomplete[0]]
    block = rendered[tail_start(rendered, n, counts=is_counted):]
    newest = next((t for t in reversed(times) if t is not None), None)
    return Block(to_units(block, ()), newest)


def _when(ts: float | None) -> str:
    if ts is None:
        return "an unknown time"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user(text: str, parts: bool | None) -> Message:
    if parts:
        return {"role": "user", "content": [{"type": "text", "text": text}]}
    return {"role": "user", "content": text}


def frame(kept: Sequence[Message], source: CarrySource, notes: Notes, ended_at: float | None,
          parts: bool | None) -> list[Message]:
    """The carried messages between their opening and closing notes."""
    opening = notes.carry_forward_text(
        messages=sum(1 for m in kept if is_counted(m)), ended_at=_when(ended_at),
        session_id=source.session_id, reason=source.reason)
    if source.summary:
        opening += "\n\n" + agent_summary(source.summary)
    return [_user(opening, parts), *kept, _user(notes.carry_forward_end, parts)]

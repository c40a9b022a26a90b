"""Where a list of OpenAI chat messages may be cut, and how much of it to keep.

An assistant message with ``tool_calls`` and the tool results answering it form one
indivisible exchange (parallel calls included): cutting inside it would leave a tool result
without its call, which every OpenAI-compatible server rejects. So the list is cut only at
*legal starts*: a message that is not a tool result and does not sit between a call and one of
its results. Keeping "the last N messages" means picking a legal start; fitting a token budget
means moving that start forward, a whole exchange at a time.

All functions are pure, take the messages as plain dicts, and never raise on odd input
(entries that are not objects, missing ids): such entries simply count as ordinary messages.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.wire.content import has_role

__all__ = [
    "RAW_ROLES",
    "Unit",
    "call_ids",
    "fit_start",
    "incomplete_tool_calls",
    "is_raw",
    "legal_starts",
    "orphan_tool_results",
    "role_problems",
    "tail_start",
    "units",
]

RAW_ROLES = frozenset({"user", "assistant", "tool"})
Message = Mapping[str, Any]


def is_raw(message: object) -> bool:
    """A conversation message (user, assistant, tool), not a system or developer prompt."""
    return has_role(message, RAW_ROLES)


def _role(message: object) -> object:
    return message.get("role") if isinstance(message, Mapping) else None


def call_ids(message: object) -> Iterator[str]:
    """Ids of the tool calls an assistant message makes."""
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        return
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                yield call["id"]


def _result_id(message: object) -> str | None:
    if isinstance(message, Mapping) and message.get("role") == "tool":
        value = message.get("tool_call_id")
        return value if isinstance(value, str) else None
    return None


def legal_starts(messages: Sequence[object]) -> list[int]:
    """Indices where the list may start without orphaning a tool result, ascending."""
    issued: dict[str, int] = {}
    inside = [0] * (len(messages) + 1)  # difference array: +1 after a call, -1 after its result
    roles: list[object] = []
    # One pass over every message of every request: plain dict access, no helper calls.
    for j, message in enumerate(messages):
        if not isinstance(message, dict):
            roles.append(None)
            continue
        role = message.get("role")
        roles.append(role)
        if role == "assistant":
            if message.get("tool_calls"):
                for call_id in call_ids(message):
                    issued[call_id] = j
        elif role == "tool":
            result = message.get("tool_call_id")
            # A result answers the latest open call with its id, once; a duplicate is an orphan.
            k = issued.pop(result, None) if isinstance(result, str) else None
            if k is not None:
                inside[k + 1] += 1
                inside[j + 1] -= 1
    starts: list[int] = []
    depth = 0
    for i, role in enumerate(roles):
        depth += inside[i]
        if depth == 0 and role != "tool":
            starts.append(i)
    return starts


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages ``[start, end)`` that are kept or dropped together."""

    start: int
    end: int
    legal: bool  # False only for leading tool results whose calls are not in the list

    def __len__(self) -> int:
        return self.end - self.start


def units(messages: Sequence[object]) -> list[Unit]:
    """The list split at its legal starts; a plain message is a unit of one."""
    starts = legal_starts(messages)
    out: list[Unit] = []
    if messages and (not starts or starts[0] > 0):
        out.append(Unit(0, starts[0] if starts else len(messages), legal=False))
    bounds = [*starts, len(messages)]
    out.extend(Unit(a, b, legal=True) for a, b in itertools.pairwise(bounds))
    return out


def tail_start(messages: Sequence[object], n: int,
               counts: Callable[[object], bool] = is_raw,
               starts: Sequence[int] | None = None) -> int:
    """The latest legal start that keeps at least ``n`` counted messages up to the end.

    When fewer than ``n`` exist, the earliest legal start (as many as can be kept legally).
    ``len(messages)`` means keep nothing (``n <= 0`` or no legal start at all).
    """
    if n <= 0:
        return len(messages)
    starts = legal_starts(messages) if starts is None else starts
    if not starts:
        return len(messages)
    seen = 0
    position = len(messages)
    # Walk back over legal starts, counting the messages between them.
    for s in reversed(starts):
        seen += sum(1 for m in messages[s:position] if counts(m))
        position = s
        if seen >= n:
            return s
    return starts[0]


def fit_start(costs: Sequence[int], budget: int, starts: Sequence[int],
              lo: int = 0) -> int:
    """The earliest legal start ``s >= lo`` whose suffix costs at most ``budget``.

    ``costs`` are per-message token counts. Moving the start forward drops the oldest whole
    units first. Returns ``len(costs)`` when even the last unit does not fit.
    """
    suffix = 0
    best = len(costs)
    position = len(costs)
    first = bisect.bisect_left(starts, lo)
    for s in reversed(starts[first:]):
        suffix += sum(costs[s:position])
        position = s
        if suffix > budget:
            break
        best = s
    return best


def orphan_tool_results(messages: Sequence[object]) -> list[int]:
    """Tool results answering no call made earlier in the list (or answering one twice)."""
    open_calls: set[str] = set()
    orphans: list[int] = []
    for i, message in enumerate(messages):
        open_calls.update(call_ids(message))
        if _role(message) == "tool":
            result = _result_id(message)
            if result is None or result not in open_calls:
                orphans.append(i)
            else:
                open_calls.discard(result)
    return orphans


def incomplete_tool_calls(messages: Sequence[object]) -> list[int]:
    """Assistant messages with a tool call that no later tool result answers."""
    answered: set[str] = set()
    incomplete: list[int] = []
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        result = _result_id(message)
        if result is not None:
            answered.add(result)
        ids = list(call_ids(message))
        if ids and not all(c in answered for c in ids):
            incomplete.append(i)
        for c in ids:
            answered.discard(c)
    incomplete.reverse()
    return incomplete


def role_problems(messages: Sequence[object]) -> list[str]:
    """Human-readable violations of the tool-call pairing rules, empty when the list is valid."""
    problems = [f"message {i}: tool result without its assistant tool call"
                for i in orphan_tool_results(messages)]
    problems += [f"message {i}: assistant tool call without all its results"
                 for i in incomplete_tool_calls(messages)]
    return problems

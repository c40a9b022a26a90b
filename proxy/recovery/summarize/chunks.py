"""Split the material of a summary into chunks the summarizing model can read in one call.

Chunks are contiguous runs of whole units. A unit is one message, except a tool exchange: an
assistant message with ``tool_calls`` together with every tool result answering it (and any
message between them), because a tool result read without its call, or a call without its
result, misleads the summarizer. Chunks are balanced by token share: with ``k`` chunks needed,
each aims at ``total / k`` tokens rather than filling the first ones to the brim and leaving a
sliver for the last.

Pure: the token counter is a parameter, so this module does not depend on the tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Chunk", "CountTokens", "exchange_units", "plan_chunks"]

CountTokens = Callable[[dict[str, Any]], int]


@dataclass(frozen=True, slots=True)
class Chunk:
    start: int  # index of the first message
    end: int  # one past the last message
    tokens: int


def _call_ids(message: Mapping[str, Any]) -> set[str]:
    if message.get("role") != "assistant":
        return set()
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return set()
    return {c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str)}


def _has_calls(message: Mapping[str, Any]) -> bool:
    calls = message.get("tool_calls")
    return message.get("role") == "assistant" and isinstance(calls, list) and bool(calls)


def exchange_units(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """Half-open index ranges of the units, in order, covering every message once."""
    units: list[tuple[int, int]] = []
    i = 0
    n = len(messages)
    while i < n:
        if not _has_calls(messages[i]):
            units.append((i, i + 1))
            i += 1
            continue
        pending = _call_ids(messages[i])
        last = i
        j = i + 1
        while j < n:
            role = messages[j].get("role")
            if role in ("tool", "function"):
                pending.discard(str(messages[j].get("tool_call_id")))
                last = j
            elif role == "assistant" or not pending:
                break
            j += 1
        units.append((i, last + 1))
        i = last + 1
    return units


def plan_chunks(
    messages: Sequence[dict[str, Any]],
    budget_tokens: int,
    count_tokens: CountTokens,
) -> tuple[Chunk, ...]:
    """Chunks of at most ``budget_tokens`` each (a single unit above the budget stands alone)."""
    if budget_tokens <= 0:
        raise ValueError(f"budget_tokens must be positive, got {budget_tokens}")
    if not messages:
        return ()
    sized = [(s, e, sum(max(0, count_tokens(messages[k])) for k in range(s, e)))
             for s, e in exchange_units(messages)]
    total = sum(t for _, _, t in sized)
    if total <= budget_tokens:
        return (Chunk(0, len(messages), total),)
    target = total / math.ceil(total / budget_tokens)
    chunks: list[Chunk] = []
    start, tokens = 0, 0
    for s, _end, t in sized:
        # close before this unit when it would not fit, or when more than half of it would land
        # beyond this chunk's share
        if tokens > 0 and (tokens + t > budget_tokens or tokens + t / 2 > target):
            chunks.append(Chunk(start, s, tokens))
            start, tokens = s, 0
        tokens += t
    chunks.append(Chunk(start, len(messages), tokens))
    return tuple(chunks)

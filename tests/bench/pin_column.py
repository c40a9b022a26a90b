"""The "pins" column of eval_summaries: how many of a task's must-keep facts the model still
receives, word for word, after a compaction, without pins and with the user's pins.

A compaction keeps the last ``tail`` messages raw (moved back so the tail never starts with
a tool result) and replaces the rest with its summary, rendered as Pi renders one. With
pins, the conversation is the one the user wrote pinning ``Task.pins`` (``!pin`` before
them), and tailfloor's own floor step (``proxy.floor.pinning.with_pins``: the default pin
patterns, the default note and budget) puts the pins the request lacks after the summary.
The same summary goes into both, so the difference is the pins alone. Each fact counts
when its ``verbatim`` words are a substring of what is sent; the check is this file's, not
tailfloor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.floor.decision import Decision
from proxy.floor.pinning import with_pins
from proxy.floor.pins import pins_in
from proxy.policy.records import Policy
from proxy.report import AGENT, Origin
from proxy.tokens import TokenCounter, with_margin
from proxy.wire.content import message_text
from tests.bench.summary_tasks import Message, Task, pinned_copy

__all__ = ["PinColumn", "column", "received", "split"]

# How Pi shows the model its compaction summary (shared/docs/transcripts.md, 1.3).
SUMMARY_HEAD = ("The conversation history before this point was compacted into the "
                "following summary:\n\n<summary>\n")


@dataclass(frozen=True, slots=True)
class PinColumn:
    without: float  # share of the facts received verbatim, 0-100
    with_pins: float
    pinned: int  # pins the request received
    lost_without: tuple[str, ...]
    lost_with: tuple[str, ...]


def split(messages: Sequence[Message], tail: int) -> tuple[list[Message], list[Message]]:
    """(what the compaction summarizes, the raw tail): the system prompt in neither."""
    conversation = [m for m in messages if m["role"] != "system"]
    cut = max(0, len(conversation) - tail)
    while cut > 0 and conversation[cut]["role"] == "tool":
        cut -= 1
    return conversation[:cut], conversation[cut:]


def received(task: Task, summary: str, tail: int, *, pinned: bool
             ) -> tuple[list[Message], int]:
    """The messages the model receives after a compaction that kept ``tail`` raw, and how
    many pins tailfloor put in."""
    written = pinned_copy(task) if pinned else task.messages
    system = [m for m in written if m["role"] == "system"]
    _head, raw = split(written, tail)
    messages = [*system, {"role": "user", "content": SUMMARY_HEAD + summary + "\n</summary>"},
                *raw]
    if not pinned:
        return messages, 0
    policy = Policy()
    rows = [(str(i), m["role"], message_text(m)) for i, m in enumerate(written)
            if m["role"] in ("user", "assistant")]
    pins = pins_in(rows, policy.pin_patterns, pin_assistant=policy.pin_assistant,
                   max_pinned=policy.max_pinned).pins
    body = {"model": "bench", "messages": messages}
    raw_body = orjson.dumps(body)
    chat = ChatRequest.parse(raw_body, orjson.loads(raw_body), None)
    origins = (*(AGENT for _ in system), Origin("summary"), *(AGENT for _ in raw))
    floor = Decision("floor", "floor", raw_body, messages=tuple(messages), origins=origins)
    tokens = TokenCounter()

    def count(text: str) -> int:
        return with_margin(tokens.message({"role": "user", "content": text}, "estimate"), 0.0)

    decision = with_pins(floor, chat, policy, list(pins), room=1_000_000, count=count,
                         head=len(system))
    assert decision.messages is not None
    return list(decision.messages), int(decision.details.get("pinned", 0))


def _text(messages: Sequence[Message]) -> str:
    """Everything the model reads of ``messages``: texts and tool-call arguments."""
    parts: list[str] = []
    for message in messages:
        parts.append(message_text(message))
        for call in message.get("tool_calls") or ():
            function: dict[str, Any] = call.get("function") or {}
            parts.append(str(function.get("arguments", "")))
    return "\n\n".join(parts)


def _lost(task: Task, messages: Sequence[Message]) -> tuple[str, ...]:
    text = _text(messages)
    return tuple(f.name for f in task.facts if f.verbatim not in text)


def column(task: Task, summary: str, tail: int) -> PinColumn:
    plain, _none = received(task, summary, tail, pinned=False)
    pinned, inserted = received(task, summary, tail, pinned=True)
    lost_without, lost_with = _lost(task, plain), _lost(task, pinned)
    total = len(task.facts)
    return PinColumn(100.0 * (total - len(lost_without)) / total,
                     100.0 * (total - len(lost_with)) / total, inserted,
                     lost_without, lost_with)

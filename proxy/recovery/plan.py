"""Where a compaction cuts a request, and the messages of the compacted request.

A request is ``head`` (its leading system/developer messages, never touched) followed by the
conversation. The conversation may open with a summary (the agent's own, or one tailfloor
stored earlier for this prefix): ``covered`` messages are then already summarized by
``summary``. A compaction summarizes ``conversation[covered:keep]`` (updating ``summary``) and
keeps ``conversation[keep:]`` raw: at least ``min_tail`` raw messages and the whole current
turn, tool exchanges whole, moved forward (oldest exchange first) when that tail does not fit.

Pure: token costs are passed in; nothing here counts, sends or stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.wire.boundary import fit_start, legal_starts, tail_start
from proxy.wire.content import text_parts
from proxy.wire.openclaw import find_runtime
from proxy.wire.summary import summary_message, unwrap_summary

__all__ = [
    "Cut",
    "Prior",
    "compacted_messages",
    "dropped_note",
    "fallback_messages",
    "find_cut_point",
    "runtime_line",
    "turn_start",
]

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Prior:
    """What of the conversation is already summarized: ``conversation[:covered]`` by ``summary``."""

    covered: int = 0
    summary: str | None = None

    @classmethod
    def of(cls, conversation: Sequence[Message]) -> Prior:
        """The agent's own summary, when the conversation opens with one."""
        if conversation:
            text = unwrap_summary(conversation[0])
            if text is not None:
                return cls(1, text)
        return cls()


@dataclass(frozen=True, slots=True)
class Cut:
    keep: int  # first raw message kept; conversation[covered:keep] gets summarized
    turn: int  # first message of the current turn (always kept)
    fits: bool  # the kept messages fit the budget given
    trimmed: int  # messages of the min_tail floor dropped because the floor did not fit


def turn_start(conversation: Sequence[Message], starts: Sequence[int]) -> int:
    """The first message of the current turn: what follows the last assistant message (the
    user's new text, or the results of the tool calls being answered), widened back to a legal
    start so that a tool exchange stays whole."""
    if not conversation:
        return 0
    last = next((i for i in range(len(conversation) - 1, -1, -1)
                 if isinstance(conversation[i], dict)
                 and conversation[i].get("role") == "assistant"), -1)
    candidate = min(last + 1, len(conversation) - 1)
    legal = [s for s in starts if s <= candidate]
    if legal:
        return legal[-1]
    return starts[0] if starts else len(conversation)


def find_cut_point(conversation: Sequence[Message], costs: Sequence[int], *, covered: int,
             min_tail: int, available: int) -> Cut:
    """Where the raw tail starts so that it holds ``min_tail`` raw messages and the current
    turn within ``available`` tokens (``costs`` per conversation message)."""
    starts = [s for s in legal_starts(conversation) if s >= covered]
    if not starts:  # nowhere to cut legally: nothing can be summarized
        return Cut(keep=covered, turn=covered, fits=sum(costs[covered:]) <= available, trimmed=0)
    turn = turn_start(conversation, starts)
    floor = tail_start(conversation, min_tail, starts=starts)
    keep = max(min(floor, turn), covered)
    trimmed = 0
    if sum(costs[keep:]) > available:
        fitted = min(fit_start(costs, available, starts, lo=keep), turn)
        trimmed = fitted - keep
        keep = max(fitted, covered)
    return Cut(keep=keep, turn=turn, fits=sum(costs[keep:]) <= available, trimmed=trimmed)


def runtime_line(conversation: Sequence[Message]) -> str | None:
    """OpenClaw's ``Runtime: agent=... | session=...`` line at the end of the first
    conversation message (its first user message, or a second text part of its summary)."""
    if not conversation or conversation[0].get("role") != "user":
        return None
    return find_runtime(list(text_parts(conversation[0].get("content"))))


def _with_runtime(message: Message, runtime: str | None) -> Message:
    """As OpenClaw does after its own compaction: the Runtime line (session identity, host
    facts the model was given) stays, as a second text part of the message that replaced it."""
    if runtime is None:
        return message
    return {**message, "content": [*message["content"], {"type": "text", "text": runtime}]}


def compacted_messages(head: Sequence[Message], summary: str, tail: Sequence[Message],
                       note: str | None = None, runtime: str | None = None) -> list[Message]:
    """System prompt, the summary (saying the raw tail follows), the raw tail."""
    return [*head, _with_runtime(summary_message(summary, note), runtime), *tail]


def dropped_note(dropped: int, tokens: int) -> Message:
    """Says what the fallback dropped, so the model knows history is missing."""
    return {"role": "user", "content": [{"type": "text", "text": (
        f"[tailfloor] {dropped} earlier messages of this conversation (about {tokens} tokens) "
        "were dropped to fit the model's context window; no summary of them could be made. "
        "Ask the user if something you need from them is missing.")}]}


def fallback_messages(head: Sequence[Message], conversation: Sequence[Message], prior: Prior,
                      keep: int, dropped_tokens: int, *,
                      note: str | None = None) -> list[Message]:
    """The summarizer failed: keep the head, the summary already there, a note, the tail."""
    kept_summary = list(conversation[:1]) if prior.covered == 1 and prior.summary else []
    runtime = runtime_line(conversation)
    if prior.covered > 1 and prior.summary:
        kept_summary = [_with_runtime(summary_message(prior.summary, note), runtime)]
    note_message = dropped_note(keep - prior.covered, dropped_tokens)
    if not kept_summary:
        note_message = _with_runtime(note_message, runtime)
    return [*head, *kept_summary, note_message, *conversation[keep:]]

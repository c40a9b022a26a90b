"""The compaction summary as a message: the wrapper Pi and OpenClaw use, written once. Pure.

Pi and OpenClaw show the model their summary as a user message
``"The conversation history before this point was compacted into the following summary:
\n\n<summary>\n" + summary + "\n</summary>"`` (OpenClaw may add a second text part with its
Runtime line). tailfloor's own summaries use the same wrapper, so agents and later
compactions recognise them; detection looks for the tag plus the phrase, not the exact
prefix (one OpenClaw build puts a marker line before it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.wire.content import content_text

__all__ = [
    "BRANCH_PREFIX",
    "BRANCH_SUFFIX",
    "COMPACTION_PREFIX",
    "COMPACTION_SUFFIX",
    "SUMMARY_PHRASE",
    "agent_summary",
    "is_summary_text",
    "summary_message",
    "unwrap_summary",
]

COMPACTION_PREFIX = ("The conversation history before this point was compacted into the "
                     "following summary:\n\n<summary>\n")
COMPACTION_SUFFIX = "\n</summary>"
BRANCH_PREFIX = ("The following is a summary of a branch that this conversation came back "
                 "from:\n\n<summary>\n")
BRANCH_SUFFIX = "</summary>"
SUMMARY_PHRASE = "was compacted into the following summary"
_PRECEDENCE_NOTE = (
    "The most recent messages follow verbatim; where they overlap with this summary or "
    "contradict it, the messages take precedence.")


def is_summary_text(text: str) -> bool:
    return "<summary>" in text and SUMMARY_PHRASE in text


def agent_summary(summary: str) -> str:
    """The text an agent shows for its own compaction summary."""
    return COMPACTION_PREFIX + summary + COMPACTION_SUFFIX


def summary_message(summary: str, note: str | None = None) -> dict[str, Any]:
    """The user message that carries a tailfloor summary into a compacted request; ``note``
    (the rules' ``summary_followed``) replaces the built-in sentence that the raw tail
    follows."""
    text = f"{COMPACTION_PREFIX}{summary.strip()}{COMPACTION_SUFFIX}\n\n{note or _PRECEDENCE_NOTE}"
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def unwrap_summary(message: object) -> str | None:
    """The summary inside a compaction-summary user message (ours, Pi's or OpenClaw's)."""
    if not isinstance(message, Mapping) or message.get("role") != "user":
        return None
    text = content_text(message.get("content"))
    if SUMMARY_PHRASE not in text:
        return None
    start = text.find("<summary>")
    end = text.rfind("</summary>")
    if start < 0 or end <= start:
        return None
    inner = text[start + len("<summary>"):end].strip("\n")
    return inner if inner.strip() else None

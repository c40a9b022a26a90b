"""A clean slate when the user asks for one: a new session whose first user message starts
with the rules' ``clean_slate_marker`` (default ``--clean``) gets nothing of the session
before it, on its first request and on every later one; the marker is taken out of the
message before it goes upstream, and nothing else of it changes.

What the agents do with it, seen live: Pi sends the text of a prompt as typed (and keeps it
so in its transcript), so ``--clean <text>`` as the first prompt after ``new_session`` (RPC)
arrives as the new session's first user message. OpenClaw 2026.9.6's gateway ``agent`` turns
pass ``/new --clean <text>`` on as plain text in the same session (no command is parsed on
that path): start the new session with ``sessions.reset`` (or ``/new`` where a channel
parses commands) and begin its first message with ``--clean``; it arrives after OpenClaw's
timestamp.
The session stays clean across proxy restarts: its first user message says so, in every
request that still holds it and in its transcript. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.floor.decision import Decision
from proxy.policy.pin_patterns import ENVELOPE
from proxy.wire.content import first_text, head_length

__all__ = ["cleaned", "first_user_text", "is_clean", "marked_clean", "without_marker"]


def first_user_text(messages: Sequence[Any]) -> tuple[int, str] | None:
    """The first user message after the head, and its text (None when there is none)."""
    for index in range(head_length(messages), len(messages)):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            return index, first_text(message) or ""
    return None


def marked_clean(text: str, marker: str | None) -> bool:
    """Whether a user text starts with the marker (after an agent's timestamp)."""
    # The envelope is anchored at the start, so a text that starts with the marker holds
    # it: the substring test decides most requests without the regex.
    if not marker or marker not in text:
        return False
    body = ENVELOPE.sub("", text.lstrip(), count=1)
    return body == marker or body.startswith(marker + " ") or body.startswith(marker + "\n")


def without_marker(message: dict[str, Any], marker: str) -> dict[str, Any]:
    """The message with the marker (and the space after it) taken out of its first text."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": _strip(content, marker)}
    if isinstance(content, list):
        parts = list(content)
        for i, part in enumerate(parts):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts[i] = {**part, "text": _strip(part["text"], marker)}
                break
        return {**message, "content": parts}
    return message


def _strip(text: str, marker: str) -> str:
    lead = len(text) - len(text.lstrip())
    found = ENVELOPE.match(text[lead:])
    start = lead + (found.end() if found else 0)
    if not text.startswith(marker, start):
        return text
    end = start + len(marker)
    if end < len(text) and text[end] in " \n":
        end += 1
    return text[:start] + text[end:]



def is_clean(messages: Sequence[Any] | None, marker: str | None) -> int | None:
    """The index of the request's first user message when it asks for a clean slate."""
    if not marker or not messages:
        return None
    first = first_user_text(messages)
    return first[0] if first is not None and marked_clean(first[1], marker) else None


def cleaned(decision: Decision, chat: ChatRequest, index: int, marker: str) -> Decision:
    """``decision`` with the marker out of the request's first user message (which keeps
    its place: what the floor adds goes before the request's own messages or after its
    summary, and a clean session's first message is its own)."""
    messages = list(decision.messages) if decision.messages is not None else \
        list(chat.body.get("messages") or [])
    target = chat.body["messages"][index]
    at = next((i for i, m in enumerate(messages) if m is target), None)
    if at is None:
        return decision
    messages[at] = without_marker(target, marker)
    return replace(decision, body=orjson.dumps({**chat.body, "messages": messages}),
                   messages=tuple(messages))

"""An oracle of the tests' own for what the floor puts back: the messages a synthetic
transcript holds, read from the entries the test wrote (never through the catalog's
rendering, which the floor itself uses), and a view of chat messages to compare them by.

From the transcript formats (shared docs, transcripts.md): a Pi/OpenClaw ``message`` entry
holds ``role`` user, assistant or toolResult, its ``content`` a list of blocks (``text``, and
for an assistant ``toolCall`` with ``id``, ``name`` and ``arguments``); a toolResult names its
``toolCallId``. On the wire (OpenAI chat) a user or assistant message has the text, an
assistant's calls are ``tool_calls`` with ``function.arguments`` as JSON, a tool result is
``role: tool`` with ``tool_call_id``. ``compaction`` and ``reset`` entries are no messages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

View = tuple[str, str, tuple[tuple[str, str, str], ...], str]


def _args(value: object) -> str:
    parsed = json.loads(value) if isinstance(value, str) else value
    return json.dumps(parsed, sort_keys=True)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") in ("text", None))
    return ""


def transcript_views(objs: Sequence[dict[str, Any]], before: str | None = None
                     ) -> list[View]:
    """The raw messages of a transcript's entries (up to entry ``before``), in order."""
    out: list[View] = []
    for obj in objs:
        if obj.get("id") == before:
            break
        message = obj.get("message") if obj.get("type") == "message" else None
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role == "user":
            out.append(("user", _text(content), (), ""))
        elif role == "assistant":
            calls = tuple((b["id"], b["name"], _args(b.get("arguments", {})))
                          for b in content or [] if b.get("type") == "toolCall")
            out.append(("assistant", _text(content), calls, ""))
        elif role == "toolResult":
            out.append(("tool", _text(content), (), str(message.get("toolCallId"))))
    return out


def wire_view(message: dict[str, Any]) -> View:
    """A chat message as sent, in the same terms."""
    role = message.get("role", "")
    calls = tuple((c["id"], c["function"]["name"], _args(c["function"].get("arguments", "{}")))
                  for c in message.get("tool_calls") or [])
    return (role, _text(message.get("content")), calls, str(message.get("tool_call_id") or ""))


def is_raw(view: View) -> bool:
    return view[0] in ("user", "assistant", "tool")


def contiguous(part: Sequence[View], whole: Sequence[View]) -> bool:
    part, whole = list(part), list(whole)
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))

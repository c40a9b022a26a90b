"""The summarization prompt: serialized conversation in, OpenAI chat request body out.

The wrapper that turns a summary into the user message the model sees is
``proxy.wire.summary``.

Pure: no I/O, no network.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import orjson

__all__ = [
    "SYSTEM_PROMPT",
    "TokenField",
    "build_request",
    "clip_text",
    "prompt_overhead",
    "readable_text",
    "serialize_messages",
]

TokenField = Literal["max_tokens", "max_completion_tokens"]

SYSTEM_PROMPT = (
    "You are a context summarization assistant. You read a conversation between a user and an "
    "AI assistant that uses tools, and you write a structured summary that lets another "
    "assistant carry on with the work without the original messages.\n\n"
    "Do not continue the conversation, do not answer the questions asked in it and do not call "
    "tools. Output only the summary, in the format you are given."
)

_FORMAT = """## Goal
[What the user wants to achieve; several items if the session covers several tasks.]

## Constraints & Preferences
- [Requirements, limits and preferences the user stated, or "(none)"]

## Progress
### Done
- [x] [Finished work and changes made]

### In Progress
- [ ] [Work under way when the conversation stops]

### Blocked
- [What stops progress, or "(none)"]

## Key Decisions
- **[Decision]**: [Why it was taken]

## Next Steps
1. [What should happen next, in order]

## Critical Context
- [Data, values and references needed to go on, or "(none)"]"""

_RULES = (
    "Copy identifiers, file paths, function names, commands, numbers and error messages exactly "
    "as they appear; never paraphrase them. Keep every section, be concise and prefer lists. "
    "Include the user's most recent request even when it is not done yet."
)

_NEW_INSTRUCTIONS = (
    "The text inside <conversation> is a conversation to summarize. Write a structured summary "
    "of it that another assistant will use to continue the work, in exactly this format:\n\n"
    f"{_FORMAT}\n\n{_RULES}"
)

_UPDATE_INSTRUCTIONS = (
    "The text inside <previous-summary> summarizes the earlier part of this conversation; the "
    "text inside <conversation> is what happened after it. Write an updated summary that "
    "merges both, in exactly this format:\n\n"
    f"{_FORMAT}\n\n"
    "Keep everything from the previous summary that still holds, move finished work to Done, "
    "add new decisions and context, and drop only what the new messages make obsolete. "
    f"{_RULES}"
)

def readable_text(content: object) -> str:
    """A content as the summarizer reads it: its texts, and its other parts named."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, Mapping):
            kind = part.get("type")
            text = part.get("text")
            if isinstance(text, str):
                pieces.append(text)
            elif kind == "image_url":
                pieces.append("[image]")
            elif isinstance(kind, str):
                pieces.append(f"[{kind}]")
    return "\n".join(pieces)


def clip_text(text: str, limit: int) -> str:
    """Head and tail of a long text: tool output ends with what matters as often as it starts."""
    if len(text) <= limit:
        return text
    head = (limit * 2) // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail:]}"


def _json(value: object) -> str:
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # integers beyond 64 bits or lone surrogates, which orjson refuses
        return json.dumps(value, default=str)


def _call_text(call: Mapping[str, Any], args_chars: int) -> str:
    function = call.get("function")
    if not isinstance(function, Mapping):
        return "?()"
    name = function.get("name") if isinstance(function.get("name"), str) else "?"
    raw = function.get("arguments")
    try:
        args = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        args = raw
    if isinstance(args, Mapping):
        rendered = ", ".join(f"{k}={_json(v)}" for k, v in args.items())
    elif args is None:
        rendered = ""
    else:
        rendered = raw if isinstance(raw, str) else _json(args)
    return f"{name}({clip_text(rendered, args_chars)})"


def serialize_messages(
    messages: Sequence[Mapping[str, Any]],
    tool_result_chars: int = 2000,
    tool_args_chars: int = 2000,
    text_chars: int | None = None,
) -> str:
    """Plain-text transcript of OpenAI chat messages for the summarizer to read.

    Tool calls read as ``name(arg=value, ...)``; tool results are clipped to a bounded length,
    and so is every other text when ``text_chars`` is given (a single message larger than the
    summarizer's window). Reasoning fields are left out: they are long and the answers carry
    their conclusions.
    """
    tool_names: dict[str, str] = {}
    blocks: list[str] = []
    for message in messages:
        role = message.get("role")
        text = readable_text(message.get("content"))
        if text_chars is not None and role not in ("tool", "function"):
            text = clip_text(text, text_chars)
        if role == "assistant":
            if text.strip():
                blocks.append(f"[Assistant]: {text}")
            calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
            for call in calls:
                function = call.get("function")
                if isinstance(call.get("id"), str) and isinstance(function, Mapping):
                    tool_names[call["id"]] = str(function.get("name"))
            if calls:
                rendered = "; ".join(_call_text(c, tool_args_chars) for c in calls)
                blocks.append(f"[Assistant tool calls]: {rendered}")
        elif role in ("tool", "function"):
            call_id = message.get("tool_call_id")
            name = tool_names.get(call_id) if isinstance(call_id, str) else None
            label = f"[Tool result {name}]" if name else "[Tool result]"
            blocks.append(f"{label}: {clip_text(text, tool_result_chars)}")
        elif role in ("system", "developer"):
            blocks.append(f"[System]: {text}")
        elif role == "user":
            blocks.append(f"[User]: {text}")
        else:
            blocks.append(f"[{role}]: {text}")
    return "\n\n".join(blocks)


# Tokens a chat template wraps around two messages and the reply (role markers, separators):
# a few per message for OpenAI's, more for some local models' templates.
_TEMPLATE_SLACK = 48


def prompt_overhead(count: Callable[[dict[str, Any]], int]) -> int:
    """What one summarization call costs besides its conversation and carried summary: the
    system prompt, the instructions and the tags, counted by ``count`` (tokens of a message,
    the model's margin included) for the longer of the two variants, plus template slack.
    Counted rather than assumed, so a model with a small window keeps room for material."""
    bodies = (build_request("", "", 1), build_request("", "", 1, previous_summary="-"))
    return max(sum(count(m) for m in body["messages"]) for body in bodies) + _TEMPLATE_SLACK


def build_request(
    conversation: str,
    model: str,
    max_output_tokens: int,
    previous_summary: str | None = None,
    token_field: TokenField = "max_completion_tokens",
) -> dict[str, Any]:
    """The OpenAI chat body of one summarization call: non-streaming, bounded, no tools."""
    if previous_summary:
        user_text = (
            f"<previous-summary>\n{previous_summary}\n</previous-summary>\n\n"
            f"<conversation>\n{conversation}\n</conversation>\n\n{_UPDATE_INSTRUCTIONS}"
        )
    else:
        user_text = f"<conversation>\n{conversation}\n</conversation>\n\n{_NEW_INSTRUCTIONS}"
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": [{"type": "text", "text": user_text}]},
        ],
        "stream": False,
        token_field: max_output_tokens,
    }

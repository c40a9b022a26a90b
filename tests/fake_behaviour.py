"""What the fake upstream answers when no reply is scripted: enough of a model's behaviour to
drive real agents (Pi, OpenClaw) through tool calls, compaction and overflow.

- a summarization request (system prompt of a context summarizer, or a ``<conversation>``
  block) gets a structured summary containing ``SUMMARY_MARKER``;
- ``LONG_REPLY`` in the current turn's user text gets a ~4.6 KB answer;
- ``USE_TOOL`` or ``USE_TOOL:<name>`` gets a tool call (bash/exec/read/ls arguments);
  with ``BIG_OUTPUT`` too, a bash/exec command that prints about 2.3 KB;
- a request right after tool results gets "The tool returned: ...";
- with ``max_chars`` set, a request whose message text exceeds it gets the OpenAI
  context_length_exceeded 400 (summarization requests are exempt unless ``strict``);
- with ``overflow_word`` set, a request whose current turn says it and whose size (the usage
  measure below) exceeds ``window_tokens`` gets that 400 naming ``window_tokens``: one turn of
  one session overflows while the other sessions of the same fake go on. ``overflow_windows``
  does the same per word, each with its own window: a test sizes each from what the agent
  really sent before (``window_for``), never from a constant fitted to today's prompt.

Usage is reported from the request size, (len(messages JSON) + len(tools JSON)) / 4, so agents
see their context grow the way they would with a real model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

SUMMARY_MARKER = "FAKE-SUMMARY-MARKER-7f3a"
_SUMMARY_REQUEST = re.compile(
    r"(create|write|produce|generate|provide|update)\b.{0,80}\b(summary|checkpoint)", re.I | re.S)


@dataclass
class AgentBehaviour:
    max_chars: int = 0
    strict: bool = False
    overflow_word: str = ""
    window_tokens: int = 8192  # also the window the max_chars error names
    overflow_windows: dict[str, int] = field(default_factory=dict)
    summary_delay: float = 0.0  # seconds a summarization call waits before its answer
    reasoning: bool = False  # default answers carry reasoning (Responses/Anthropic dialects)


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def total_chars(messages: list[dict[str, Any]]) -> int:
    count = 0
    for message in messages:
        count += len(text_of(message.get("content")))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            count += len(function.get("name", "")) + len(function.get("arguments", ""))
    return count


def current_turn_text(messages: list[dict[str, Any]]) -> str:
    """All user text after the last assistant message (OpenClaw appends an extra one)."""
    texts: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "assistant":
            break
        if message.get("role") == "user":
            texts.append(text_of(message.get("content")))
    return "\n".join(reversed(texts))


def is_summarization(messages: list[dict[str, Any]]) -> bool:
    system = text_of(messages[0].get("content")) if messages else ""
    if "summarization assistant" in system:
        return True
    last = text_of(messages[-1].get("content")) if messages else ""
    return "<conversation>" in last and bool(_SUMMARY_REQUEST.search(last))


def size_usage(payload: dict[str, Any], completion_text: str) -> dict[str, int]:
    prompt = (len(orjson.dumps(payload.get("messages") or []))
              + len(orjson.dumps(payload.get("tools") or []))) // 4
    completion = max(1, len(completion_text) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def window_for(sizes: list[int], growth: int | None = None) -> int:
    """A window the next request of a conversation overflows and a compacted retry fits: half
    a turn above the last request's size (``sizes``: the usage measure of its requests so far,
    in order; ``growth``: what one turn adds, by default the last turn's)."""
    if growth is None:
        growth = sizes[-1] - sizes[-2] if len(sizes) > 1 else 0
    if growth <= 0:
        raise ValueError(f"no growth between the requests {sizes[-2:]} to size a window from")
    return sizes[-1] + growth // 2


def overflow_error(chars: int, window: int = 8192, tokens: int = 9000) -> dict[str, Any]:
    return {"message": f"This model's maximum context length is {window} tokens. However, your "
                       f"messages resulted in {tokens} tokens. Please reduce the length of the "
                       f"messages. (chars={chars})",
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}


SUMMARY_TEXT = f"""## Goal
Keep the conversation going for the test ({SUMMARY_MARKER}).

## Constraints & Preferences
- none

## Progress
### Done
- earlier turns

### In Progress
- the current turn

### Blocked
- nothing

## Key Decisions
- none

## Next Steps
- answer the next message

## Critical Context
- {SUMMARY_MARKER}
"""

LONG_TEXT = " ".join(f"Long reply sentence number {i} with some filler words to take space."
                     for i in range(70))


def tool_arguments(name: str, big: bool = False) -> str:
    if name in ("bash", "exec"):
        return '{"command":"seq -s \' \' 1 600"}' if big else '{"command":"echo hello-from-tool"}'
    if name == "read":
        return '{"path":"README.md"}'
    if name == "ls":
        return '{"path":"."}'
    return "{}"

"""What a request in the Responses or Anthropic Messages dialect says, seen the way the live
floor tests compare requests with Pi's transcript: ``(role, what it says)`` per raw message,
and the dialect's own validity rules for tool exchanges and roles.

- ``raw_view``: Responses ``input`` items (an assistant turn is its reasoning, message and
  ``function_call`` items together) or Anthropic ``messages`` (each text block of a user
  message and each ``tool_result`` on its own: a rendered run may merge consecutive user
  turns into one message) as ``transcript_raw`` of ``test_pi_live_floor`` sees Pi's
  transcript, tool-call ids in the form Pi sends them (Responses: the ``call_id``, the part of
  Pi's ``call_...|fc_...`` before the bar).
- ``exchanges_valid``: every tool call answered right after it by a result with its id, no
  result without its call; Anthropic also: roles ``user``/``assistant`` only, the first one a
  user, no empty content, results first in their user message, and (thinking enabled) an
  assistant turn continued by tool results starting with its thinking block.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.agents.pi_dialects import ANTHROPIC, RESPONSES

Raw = tuple[str, str]


def pi_call_id(call_id: object) -> str:
    """A transcript tool-call id as Pi puts it on the wire (``call_id`` for Responses)."""
    return str(call_id).split("|", 1)[0]


def transcript_raw(path: Path) -> list[Raw]:
    """The raw messages of a Pi transcript in file order."""
    out: list[Raw] = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        message = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if role == "user":
            out.append(("user", text))
        elif role == "assistant" and message.get("stopReason") not in ("error", "aborted"):
            calls = ",".join(pi_call_id(b["id"]) for b in blocks if b.get("type") == "toolCall")
            out.append(("assistant", text + "|" + calls))
        elif role == "toolResult":
            out.append(("tool", pi_call_id(message.get("toolCallId")) + "|" + text))
    return out


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content or []  # type: ignore[attr-defined]
                   if isinstance(p, dict) and p.get("type") in ("input_text", "output_text",
                                                               "text"))


def _responses_turns(items: Iterable[dict[str, Any]]) -> list[tuple[Raw, bool]]:
    """Each raw message with whether it is an assistant turn carrying a reasoning item."""
    out: list[tuple[Raw, bool]] = []
    turn: list[Any] | None = None  # [text, calls, reasoning] of the assistant turn

    def close() -> None:
        nonlocal turn
        if turn is not None:
            out.append((("assistant", turn[0] + "|" + turn[1]), turn[2]))
        turn = None

    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning" or (kind == "message" and item.get("role") == "assistant"):
            if turn is not None and (turn[0] or turn[1]):
                close()
            turn = turn or ["", "", False]
            if kind == "message":
                turn[0] = _text(item.get("content"))
            else:
                turn[2] = True
        elif kind == "function_call":
            turn = turn or ["", "", False]
            turn[1] = ",".join(filter(None, (turn[1], str(item.get("call_id")))))
        else:
            close()
            if kind == "function_call_output":
                out.append((("tool", f"{item.get('call_id')}|{_text(item.get('output'))}"),
                            False))
            else:
                out.append(((str(item.get("role")), _text(item.get("content"))), False))
    close()
    return out


def _anthropic_raw(messages: Iterable[dict[str, Any]]) -> list[Raw]:
    out: list[Raw] = []
    for message in messages:
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if message.get("role") == "assistant":
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            calls = ",".join(str(b["id"]) for b in blocks if b.get("type") == "tool_use")
            out.append(("assistant", text + "|" + calls))
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                out.append(("tool", f"{block['tool_use_id']}|{_text(block.get('content'))}"))
            elif block.get("type") == "text":
                out.append(("user", str(block.get("text", ""))))
    return out


def history(api: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's conversation items, system prompt left out (Responses: Pi's developer
    item first; Anthropic: ``system`` is a field of its own)."""
    if api == RESPONSES:
        items = list(body["input"])
        assert items[0].get("role") in ("developer", "system"), items[0]
        return items[1:]
    return list(body["messages"])


def raw_view(api: str, items: Iterable[dict[str, Any]]) -> list[Raw]:
    if api == RESPONSES:
        return [raw for raw, _ in _responses_turns(items)]
    return _anthropic_raw(items)


def thinking_turns(api: str, items: Iterable[dict[str, Any]]) -> list[bool]:
    """For each assistant turn of ``raw_view``, in order: whether it carries its reasoning
    (Responses: a reasoning item; Anthropic: a thinking block)."""
    if api == RESPONSES:
        return [flag for (role, _), flag in _responses_turns(items) if role == "assistant"]
    return [any(b.get("type") in ("thinking", "redacted_thinking")
                for b in m.get("content") or [] if isinstance(b, dict))
            for m in items if m.get("role") == "assistant"]


def kept_assistants(path: Path, until: str) -> int:
    """Assistant messages Pi itself kept after its last compaction, before the user message
    saying ``until``."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    compaction = max(i for i, e in enumerate(entries) if e.get("type") == "compaction")
    first = [e.get("id") for e in entries].index(entries[compaction]["firstKeptEntryId"])
    count = 0
    for entry in entries[first:]:
        message = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(message, dict):
            continue
        if message.get("role") == "user" and until in json.dumps(message.get("content")):
            break
        count += message.get("role") == "assistant"
    return count


def text_of(item: dict[str, Any]) -> str:
    return json.dumps(item.get("content", item.get("output")))


def _responses_valid(items: list[dict[str, Any]]) -> str | None:
    open_calls: list[str] = []
    for k, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call":
            if not isinstance(item.get("call_id"), str) or "|" in item["call_id"]:
                return f"item {k}: call_id {item.get('call_id')!r}"
            open_calls.append(item["call_id"])
        elif kind == "function_call_output":
            if item.get("call_id") not in open_calls:
                return f"item {k}: output for {item.get('call_id')} without its call"
            open_calls.remove(item["call_id"])
        elif open_calls:
            return f"item {k} ({kind}): calls {open_calls} left without their output"
    return None


def _anthropic_valid(messages: list[dict[str, Any]], thinking: bool) -> str | None:
    if not messages or messages[0].get("role") != "user":
        return "the first message is not a user message"
    for k, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant") or not content:
            return f"message {k}: role {role!r}, content {content!r}"
        blocks = content if isinstance(content, list) else []
        calls = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if role == "assistant" and results:
            return f"message {k}: tool_result in an assistant message"
        if results and [b.get("type") for b in blocks[:len(results)]] != ["tool_result"] * len(
                results):
            return f"message {k}: tool results not first in their message"
        before = messages[k - 1] if k else {}
        asked = [b["id"] for b in before.get("content") or [] if isinstance(b, dict)
                 and b.get("type") == "tool_use"] if before.get("role") == "assistant" else []
        if role == "user" and sorted(results) != sorted(asked):
            return f"message {k}: results {results} after calls {asked}"
        if calls:
            after = messages[k + 1] if k + 1 < len(messages) else None
            if after is None:
                return f"message {k}: tool calls {calls} end the request"
            if thinking and blocks[0].get("type") not in ("thinking", "redacted_thinking") \
                    and k == max(i for i, m in enumerate(messages) if m["role"] == "assistant"):
                return f"message {k}: the turn the results continue has no thinking first"
    return None


def exchanges_valid(api: str, items: list[dict[str, Any]], thinking: bool = False
                    ) -> str | None:
    """None when the request's history is valid for the dialect, else what is wrong."""
    return _responses_valid(items) if api == RESPONSES else _anthropic_valid(items, thinking)


__all__ = ["ANTHROPIC", "RESPONSES", "exchanges_valid", "history", "kept_assistants",
           "pi_call_id", "raw_view", "text_of", "thinking_turns", "transcript_raw"]

"""Read the summarizer's answer: a non-streaming OpenAI chat completion -> text + usage.

Tolerates what real servers do to a ``stream: false`` request: an SSE body anyway (some
gateways force streaming), content as parts, reasoning wrapped in ``<think>`` tags at the start
of the content (reasoning models served by llama.cpp or vLLM without a reasoning parser).
Everything else that is not a usable summary raises :class:`MalformedSummary` saying what was
wrong, so the caller's log line explains the fallback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.wire.content import content_text
from proxy.wire.stream import DONE, event_data

__all__ = ["MalformedSummary", "SummaryAnswer", "parse_summary_response"]

_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


class MalformedSummary(ValueError):
    """The summarizer answered 200 but not with a usable summary."""


@dataclass(frozen=True, slots=True)
class SummaryAnswer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


def _usage_int(usage: object, key: str) -> int:
    if isinstance(usage, Mapping):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def _from_completion(doc: Mapping[str, Any]) -> SummaryAnswer:
    if "error" in doc:
        raise MalformedSummary(f"answer is an error object: {str(doc['error'])[:200]}")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedSummary("answer has no choices")
    choice = choices[0]
    if not isinstance(choice, Mapping) or not isinstance(choice.get("message"), Mapping):
        raise MalformedSummary("first choice has no message")
    message = choice["message"]
    if message.get("tool_calls"):
        raise MalformedSummary("the model called a tool instead of writing a summary")
    text = content_text(message.get("content"))
    finish = choice.get("finish_reason")
    usage = doc.get("usage")
    return SummaryAnswer(_clean(text), _usage_int(usage, "prompt_tokens"),
                         _usage_int(usage, "completion_tokens"),
                         finish if isinstance(finish, str) else None)


def _from_stream(body: bytes) -> SummaryAnswer:
    pieces: list[str] = []
    finish: str | None = None
    usage: object = None
    for line in body.splitlines():
        data = event_data(line)
        if data is None:
            continue
        if data == DONE:
            break
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise MalformedSummary(f"stream event is not JSON: {data[:80]!r}") from exc
        if not isinstance(event, Mapping):
            continue
        if "error" in event:
            raise MalformedSummary(f"stream carried an error: {str(event['error'])[:200]}")
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping) and isinstance(delta.get("content"), str):
                pieces.append(delta["content"])
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    return SummaryAnswer(_clean("".join(pieces)), _usage_int(usage, "prompt_tokens"),
                         _usage_int(usage, "completion_tokens"), finish)


def _clean(text: str) -> str:
    text = _THINK.sub("", text, count=1).strip()
    if not text:
        raise MalformedSummary("the summary is empty")
    return text


def parse_summary_response(body: bytes) -> SummaryAnswer:
    """Text, usage and finish reason of a 200 answer; MalformedSummary when there is no summary."""
    stripped = body.strip()
    if not stripped:
        raise MalformedSummary("empty body")
    if stripped.startswith((b"data:", b":", b"event:")):
        return _from_stream(stripped)
    try:
        doc = orjson.loads(stripped)
    except orjson.JSONDecodeError as exc:
        preview = stripped[:80].decode("utf-8", errors="replace")
        raise MalformedSummary(f"body is not JSON: {preview!r}") from exc
    if not isinstance(doc, Mapping):
        raise MalformedSummary(f"body is JSON {type(doc).__name__}, not an object")
    return _from_completion(doc)

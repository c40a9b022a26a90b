"""Anthropic Messages (``/v1/messages``) as the stages see it, and back. Pure.

A user message becomes a tool message per ``tool_result`` block and a user message for the
rest; an assistant message one assistant message (text, and ``tool_use`` blocks as tool
calls; thinking blocks stay in the message, untouched, and go back with it). ``system`` is
the system prompt. What tailfloor inserts is rendered as the agents render their history:
text blocks, tool results gathered in one user message, turns alternating.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.wire.content import content_text
from proxy.wire.dialect import (
    SYSTEM,
    EventFacts,
    Fields,
    Translation,
    assemble,
    split_system,
    with_usage,
)
from proxy.wire.usage import Usage, UsageAdjustment

__all__ = ["MESSAGES"]

Message = dict[str, Any]
_FIELDS = Fields(items="messages", system="system", limit="max_tokens")
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop",
         "max_tokens": "length", "model_context_window_exceeded": "length",
         "tool_use": "tool_calls", "refusal": "content_filter"}
_WINDOW = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT = re.compile(r"resulted in (\d+) tokens")
_UNSAFE_ID = re.compile(r"[^a-zA-Z0-9_-]")
_ERROR_TYPES = {"invalid_request_error": "invalid_request_error",
                "rate_limit_error": "rate_limit_error", "overloaded_error": "overloaded_error"}


def _blocks(content: object) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _user(index: int, content: object) -> tuple[list[Message], list[tuple[int, int]]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}], [(index, index + 1)]
    messages: list[Message] = []
    rest: list[Any] = []
    for block in _blocks(content):
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                             "content": content_text(block.get("content"))})
        else:
            rest.append(block)
    if rest or not messages:
        messages.append({"role": "user", "content": rest})
    return messages, [(index, index + 1)] * len(messages)


def _assistant(content: object) -> Message:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(content):
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": str(block.get("name", "")),
                                       "arguments": orjson.dumps(block.get("input")).decode()}})
    message: Message = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _system_text(system: object) -> str:
    return content_text(system) if isinstance(system, str | list) else ""


class AnthropicMessages:
    name = "messages"
    path = "/v1/messages"

    def translate(self, body: dict[str, Any]) -> Translation:
        raw = body.get("messages")
        items = list(raw) if isinstance(raw, list) else []
        thread = body.get("thread")
        if isinstance(thread, Mapping) and thread.get("type") == "continue":
            # Pi's message threads: only the messages after the server's own copy of the
            # conversation travel, so there is nothing here to floor or compact.
            return Translation(body, tuple(items), {**body, "messages": []}, (),
                               pass_reason="message_thread")
        messages: list[Message] = []
        spans: list[tuple[int, int]] = []
        system = body.get("system")
        if _system_text(system):
            messages.append({"role": "system", "content": _system_text(system)})
            spans.append(SYSTEM)
        for index, item in enumerate(items):
            role = item.get("role") if isinstance(item, Mapping) else None
            if role == "assistant":
                messages.append(_assistant(item.get("content")))
                spans.append((index, index + 1))
            elif role == "user":
                found, found_spans = _user(index, item.get("content"))
                messages.extend(found)
                spans.extend(found_spans)
            else:
                return Translation(body, tuple(items), {**body, "messages": []}, (),
                                   pass_reason="unsupported_item")
        chat = {k: v for k, v in body.items() if k not in ("messages", "system")}
        chat["messages"] = messages
        return Translation(body=body, items=tuple(items), chat=chat, sources=tuple(spans))

    def render(self, translation: Translation, chat: dict[str, Any]) -> dict[str, Any]:
        return assemble(translation, chat, _FIELDS, render_messages)

    def usage(self, usage: Mapping[str, Any]) -> Usage:
        return Usage.from_dict(_as_chat_usage(usage))

    def adjusted_usage(self, usage: dict[str, Any], adjust: UsageAdjustment) -> dict[str, Any]:
        chat = adjust.apply(_as_chat_usage(usage))
        reported = chat.get("prompt_tokens")
        if not isinstance(reported, int) or "input_tokens" not in usage:
            return usage
        # The agents add the three input figures up: take from the uncached part first.
        out = dict(usage)
        left = reported
        for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = min(value, left)
                left -= out[key]
        out["input_tokens"] = left
        return out

    def event_facts(self, event: Mapping[str, Any]) -> EventFacts:
        kind = event.get("type")
        if kind == "error":
            error = event.get("error")
            return EventFacts(error=_error(error) if isinstance(error, Mapping) else {})
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, Mapping):
                return EventFacts()
            usage, model = message.get("usage"), message.get("model")
            return EventFacts(usage=usage if isinstance(usage, dict) else None,
                              model=model if isinstance(model, str) else None)
        if kind == "message_delta":
            delta = event.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, Mapping) else None
            usage = event.get("usage")
            return EventFacts(usage=usage if isinstance(usage, dict) else None,
                              finish_reason=_STOP.get(reason, reason)
                              if isinstance(reason, str) else None)
        return EventFacts()

    def adjusted_event(self, event: dict[str, Any],
                       adjust: UsageAdjustment) -> dict[str, Any] | None:
        if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
            return {**event, "message": self.adjusted_answer(event["message"], adjust)}
        usage = event.get("usage")
        if event.get("type") == "message_delta" and isinstance(usage, dict) \
                and "input_tokens" in usage:
            return {**event, "usage": self.adjusted_usage(usage, adjust)}
        return None

    def answer_facts(self, answer: Mapping[str, Any]) -> EventFacts:
        if answer.get("type") == "error":
            error = answer.get("error")
            return EventFacts(error=_error(error) if isinstance(error, Mapping) else {})
        usage = answer.get("usage")
        reason, model = answer.get("stop_reason"), answer.get("model")
        return EventFacts(usage=usage if isinstance(usage, dict) else None,
                          finish_reason=_STOP.get(reason, reason)
                          if isinstance(reason, str) else None,
                          model=model if isinstance(model, str) else None)

    def adjusted_answer(self, answer: dict[str, Any], adjust: UsageAdjustment) -> dict[str, Any]:
        return with_usage(answer, lambda usage: self.adjusted_usage(usage, adjust))

    def error_body(self, openai_error: bytes) -> bytes:
        """tailfloor's own error answer in Anthropic's shape (an overflow in its wording, so
        the agents' own recovery recognises it)."""
        try:
            error = orjson.loads(openai_error).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            return openai_error
        kind = str(error.get("type") or "api_error")
        message = str(error.get("message", ""))
        window = _WINDOW.search(message)
        if error.get("code") == "context_length_exceeded" and window is not None:
            prompt = _PROMPT.search(message)
            over = int(prompt.group(1)) if prompt else int(window.group(1)) + 1
            message = f"prompt is too long: {over} tokens > {window.group(1)} maximum"
        # Anthropic's own types only: tailfloor's others are an API error to its SDK.
        kind = "request_too_large" if error.get("code") == "request_too_large" else \
            _ERROR_TYPES.get(kind, "api_error")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})

    def stream_error(self, message: str, code: str) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(
            {"type": "error", "error": {"type": "api_error", "message": message}}) + b"\n\n"

    def summary_request(self, chat: dict[str, Any]) -> dict[str, Any]:
        system, rest = split_system(chat)
        limit = chat.get("max_completion_tokens", chat.get("max_tokens"))
        out: dict[str, Any] = {"model": chat.get("model"), "messages": render_messages(rest),
                               "stream": False,
                               "max_tokens": limit if isinstance(limit, int) else 4096}
        if system:
            out["system"] = system
        return out

    def summary_answer(self, answer: bytes) -> bytes:
        try:
            doc = orjson.loads(answer)
        except orjson.JSONDecodeError:
            return answer
        if not isinstance(doc, dict) or doc.get("type") != "message":
            return answer
        message = _assistant(doc.get("content"))
        reason = doc.get("stop_reason")
        return orjson.dumps({"choices": [{"message": message, "finish_reason": _STOP.get(
            reason, reason) if isinstance(reason, str) else None}],
            "usage": _as_chat_usage(doc.get("usage") or {})})


def render_messages(messages: list[Message]) -> list[Any]:
    """Chat messages as Anthropic messages, as Pi sends its history: text blocks, tool uses,
    the tool results of a turn gathered in one user message; other messages one each (the
    API joins consecutive turns of one role itself)."""
    out: list[dict[str, Any]] = []
    results_last = False  # the last user message holds tool results only
    for message in messages:
        role = "assistant" if message.get("role") == "assistant" else "user"
        blocks: list[Any] = []
        content = message.get("content")
        text = content_text(content)
        if message.get("role") == "tool":
            blocks.append({"type": "tool_result",
                           "tool_use_id": tool_use_id(message.get("tool_call_id")),
                           "content": text})
        elif role == "user" and isinstance(content, list):
            blocks.extend(_user_blocks(content))
        elif text:
            blocks.append({"type": "text", "text": text})
        for call in message.get("tool_calls") or [] if role == "assistant" else []:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                blocks.append({"type": "tool_use", "id": tool_use_id(call.get("id")),
                               "name": str(function.get("name", "")),
                               "input": _arguments(function.get("arguments"))})
        if not blocks:
            continue
        results = message.get("role") == "tool"
        if results and out and results_last:
            out[-1]["content"].extend(blocks)  # one user turn holds a turn's tool results
        else:
            out.append({"role": role, "content": blocks})
            results_last = results
    return out


_KEPT_BLOCKS = frozenset({"text", "image", "document", "search_result"})


def _user_blocks(parts: list[Any]) -> list[Any]:
    """A user message's parts as Anthropic blocks: the client's own blocks (an image, a
    document, a text with its cache breakpoint) as they came, chat parts converted."""
    out: list[Any] = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in _KEPT_BLOCKS and (kind != "text" or isinstance(part.get("text"), str)):
            if kind != "text" or part["text"]:
                out.append(part)
        elif kind == "image_url":
            image = _image_block(part.get("image_url"))
            if image is not None:
                out.append(image)
        elif isinstance(part.get("text"), str) and part["text"]:
            out.append({"type": "text", "text": part["text"]})
    return out


def _image_block(image_url: object) -> dict[str, Any] | None:
    """A chat ``image_url`` part (a data URL, or a URL) as an Anthropic image block."""
    url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
    if not isinstance(url, str):
        return None
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media,
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def tool_use_id(tool_call_id: object) -> str:
    """A tool call's id as Anthropic takes it (``[a-zA-Z0-9_-]``, 64 at most), the way Pi
    normalises an id from another API (a Responses ``call_...|fc_...``); Anthropic's own
    ``toolu_...`` ids are unchanged."""
    text = tool_call_id if isinstance(tool_call_id, str) else ""
    return _UNSAFE_ID.sub("_", text)[:64]


def _arguments(arguments: object) -> object:
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return arguments if isinstance(arguments, dict) else {}


def _as_chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    def number(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    out: dict[str, Any] = {}
    if "input_tokens" in usage:
        out["prompt_tokens"] = (number("input_tokens") + number("cache_read_input_tokens")
                                + number("cache_creation_input_tokens"))
        out["prompt_tokens_details"] = {"cached_tokens": number("cache_read_input_tokens")}
    if "output_tokens" in usage:
        out["completion_tokens"] = number("output_tokens")
    if "prompt_tokens" in out and "completion_tokens" in out:
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def _error(error: Mapping[str, Any]) -> dict[str, Any]:
    return {"message": str(error.get("message", "")), "type": error.get("type"),
            "code": error.get("type")}


MESSAGES = AnthropicMessages()

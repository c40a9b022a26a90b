"""OpenAI Responses (``/v1/responses``) as the stages see it, and back. Pure.

``input`` items become chat messages: a message item one message; reasoning items, an
assistant message item and the function calls after it one assistant message (the reasoning
stays in its item, untouched, and goes back with it); a function call's output a tool
message. ``instructions`` is the system prompt. A request that leans on state kept by the
server (``previous_response_id``, a ``conversation``, an ``item_reference``) holds only part of
the conversation: it passes through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

__all__ = ["RESPONSES"]

Message = dict[str, Any]
_FIELDS = Fields(items="input", system="instructions", limit="max_output_tokens")
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
_SERVER_STATE = ("previous_response_id", "conversation")
_KNOWN = frozenset({"message", "function_call", "function_call_output", "reasoning"})


def _content(content: object) -> object:
    """A message item's content in chat terms (text parts as text, others kept as parts)."""
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text", part.get("refusal", "")))})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            parts.append(part)
    return parts


def _parts(content: object) -> list[Any]:
    parts = _content(content)
    return parts if isinstance(parts, list) else [{"type": "text", "text": str(parts)}]


def _kind(item: object) -> str | None:
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else None


def _translate_items(items: list[Any]) -> tuple[list[Message], list[tuple[int, int]], str | None]:
    messages: list[Message] = []
    spans: list[tuple[int, int]] = []
    start: int | None = None  # first item of the assistant turn being gathered
    turn: Message | None = None
    calls: dict[str, str] = {}

    def close(end: int) -> None:
        nonlocal start, turn
        if turn is not None and start is not None:
            messages.append(turn)
            spans.append((start, end))
        start, turn = None, None

    for index, item in enumerate(items):
        kind = _kind(item)
        if kind == "item_reference":
            return [], [], "server_state"
        if kind not in _KNOWN:
            return [], [], "unsupported_item"
        if kind == "reasoning":
            if turn is not None and (turn.get("tool_calls") or turn.get("content")):
                close(index)
            if start is None:
                start, turn = index, {"role": "assistant", "content": ""}
            continue
        if kind == "function_call":
            if turn is None:
                start, turn = index, {"role": "assistant", "content": ""}
            call_id = str(item.get("call_id", ""))
            item_id = item.get("id")
            if isinstance(item_id, str) and item_id.startswith("fc"):
                # Pi's transcripts name a call "<call_id>|<item id>": the same form here lets
                # the call's id tie the request to its transcript.
                calls[call_id] = f"{call_id}|{item_id}"
            turn.setdefault("tool_calls", []).append({
                "id": calls.get(call_id, call_id), "type": "function",
                "function": {"name": str(item.get("name", "")),
                             "arguments": str(item.get("arguments", ""))}})
            continue
        role = item.get("role") if kind == "message" else "tool"
        if role == "assistant":
            if turn is not None and (turn.get("tool_calls") or turn.get("content")):
                close(index)
            if turn is None:
                start, turn = index, {"role": "assistant", "content": ""}
            turn["content"] = _content(item.get("content"))
            continue
        close(index)
        if kind == "function_call_output":
            output = item.get("output")
            call_id = str(item.get("call_id", ""))
            messages.append({"role": "tool", "tool_call_id": calls.get(call_id, call_id),
                             "content": content_text(_content(output))})
        else:
            messages.append({"role": role if isinstance(role, str) else "user",
                             "content": _content(item.get("content"))})
        spans.append((index, index + 1))
    if turn is not None and not turn.get("tool_calls") and not turn.get("content"):
        return [], [], "unsupported_item"  # reasoning that no answer follows
    close(len(items))
    return messages, spans, None


class Responses:
    name = "responses"
    path = "/v1/responses"

    def translate(self, body: dict[str, Any]) -> Translation:
        raw_input = body.get("input")
        items: list[Any] = ([{"role": "user", "content": raw_input}]
                            if isinstance(raw_input, str) else
                            list(raw_input) if isinstance(raw_input, list) else [])
        reason = next((key for key in _SERVER_STATE if body.get(key)), None)
        messages, spans, bad = ([], [], None) if reason else _translate_items(items)
        reason = "server_state" if reason else bad
        instructions = body.get("instructions")
        if isinstance(instructions, list):  # input items, as a prompt template gives them
            instructions = content_text([p for i in instructions if isinstance(i, Mapping)
                                         for p in _parts(i.get("content"))])
        if isinstance(instructions, str) and instructions and not reason:
            messages.insert(0, {"role": "system", "content": instructions})
            spans.insert(0, SYSTEM)
        chat = {k: v for k, v in body.items()
                if k not in ("input", "instructions", "max_output_tokens")}
        chat["messages"] = messages if not reason else []
        limit = body.get("max_output_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool):
            chat["max_completion_tokens"] = limit
        return Translation(body=body, items=tuple(items), chat=chat, sources=tuple(spans),
                           pass_reason=reason)

    def render(self, translation: Translation, chat: dict[str, Any]) -> dict[str, Any]:
        typed = _typed_user(translation.items)
        return assemble(translation, chat, _FIELDS,
                        lambda messages: render_items(messages, typed_user=typed))

    def usage(self, usage: Mapping[str, Any]) -> Usage:
        return Usage.from_dict(_as_chat_usage(usage))

    def adjusted_usage(self, usage: dict[str, Any], adjust: UsageAdjustment) -> dict[str, Any]:
        chat = adjust.apply(_as_chat_usage(usage))
        out = dict(usage)
        prompt = chat.get("prompt_tokens")
        if isinstance(prompt, int):
            out["input_tokens"] = prompt
            output = usage.get("output_tokens")
            if isinstance(output, int) and not isinstance(output, bool):
                out["total_tokens"] = prompt + output
            details = usage.get("input_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                out["input_tokens_details"] = {
                    **details, "cached_tokens": min(details["cached_tokens"], prompt)}
        return out

    def event_facts(self, event: Mapping[str, Any]) -> EventFacts:
        kind = event.get("type")
        if kind == "error":
            return EventFacts(error=_error(event))
        response = event.get("response")
        if not isinstance(response, Mapping) or kind not in (
                "response.completed", "response.incomplete", "response.failed"):
            return EventFacts()
        return self.answer_facts(response)

    def adjusted_event(self, event: dict[str, Any],
                       adjust: UsageAdjustment) -> dict[str, Any] | None:
        response = event.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("usage"), dict):
            return None
        return {**event, "response": self.adjusted_answer(response, adjust)}

    def answer_facts(self, answer: Mapping[str, Any]) -> EventFacts:
        usage = answer.get("usage")
        error = answer.get("error")
        model = answer.get("model")
        return EventFacts(usage=usage if isinstance(usage, dict) else None,
                          error=_error(error) if isinstance(error, Mapping) else None,
                          finish_reason=_finish(answer),
                          model=model if isinstance(model, str) else None)

    def adjusted_answer(self, answer: dict[str, Any], adjust: UsageAdjustment) -> dict[str, Any]:
        return with_usage(answer, lambda usage: self.adjusted_usage(usage, adjust))

    def error_body(self, openai_error: bytes) -> bytes:
        return openai_error  # the Responses API answers errors in the chat shape

    def stream_error(self, message: str, code: str) -> bytes:
        return b"event: error\ndata: " + orjson.dumps(
            {"type": "error", "code": code, "message": message, "param": None}) + b"\n\n"

    def summary_request(self, chat: dict[str, Any]) -> dict[str, Any]:
        system, rest = split_system(chat)
        out: dict[str, Any] = {"model": chat.get("model"), "input": render_items(rest),
                               "stream": False, "store": False}
        if system:
            out["instructions"] = system
        limit = chat.get("max_completion_tokens", chat.get("max_tokens"))
        if isinstance(limit, int):
            out["max_output_tokens"] = limit
        return out

    def summary_answer(self, answer: bytes) -> bytes:
        try:
            doc = orjson.loads(answer)
        except orjson.JSONDecodeError:
            return answer
        if not isinstance(doc, dict) or "output" not in doc:
            return answer
        texts = [content_text(_content(item.get("content")), sep="")
                 for item in doc.get("output") or []
                 if isinstance(item, Mapping) and _kind(item) == "message"]
        calls = [item for item in doc.get("output") or []
                 if isinstance(item, Mapping) and item.get("type") == "function_call"]
        usage = _as_chat_usage(doc.get("usage") or {})
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            message["tool_calls"] = calls
        return orjson.dumps({"choices": [{"message": message, "finish_reason": _finish(doc)}],
                             "usage": usage})


def render_items(messages: list[Message], *, typed_user: bool = False) -> list[Any]:
    """Chat messages as Responses input items, the way the agents send their history: user
    items ``{"role", "content"}`` as Pi sends them, or with ``"type": "message"`` first as
    OpenClaw does (``typed_user``, learned from the request's own user items)."""
    items: list[Any] = []
    for message in messages:
        role = message.get("role")
        text = content_text(message.get("content"))
        if role == "tool":
            items.append({"type": "function_call_output",
                          "call_id": _call_id(message.get("tool_call_id")), "output": text})
        elif role == "assistant":
            if text:
                items.append({"type": "message", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": text,
                                           "annotations": []}]})
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping):
                    items.append({"type": "function_call", "call_id": _call_id(call.get("id")),
                                  "name": str(function.get("name", "")),
                                  "arguments": str(function.get("arguments", ""))})
        else:
            item: dict[str, Any] = {"type": "message"} if typed_user else {}
            item["role"] = role if isinstance(role, str) else "user"
            item["content"] = _input_parts(message.get("content"), text)
            items.append(item)
    return items


def _input_parts(content: object, text: str) -> list[Any]:
    """A user message's content as input parts: its texts and its images, in order."""
    if not isinstance(content, list) or not any(
            isinstance(p, Mapping) and p.get("type") == "image_url" for p in content):
        return [{"type": "input_text", "text": text}]
    parts: list[Any] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if isinstance(url, str):
                parts.append({"type": "input_image", "image_url": url})
        elif isinstance(part.get("text"), str):
            parts.append({"type": "input_text", "text": part["text"]})
    return parts


def _typed_user(items: Sequence[Any]) -> bool:
    """Whether the client's own user items carry ``"type": "message"`` (OpenClaw's form)."""
    return any(isinstance(item, Mapping) and item.get("role") == "user"
               and item.get("type") == "message" for item in items)


def _call_id(value: object) -> str:
    """The Responses call id of a chat tool-call id (Pi's ``<call_id>|<item id>`` form cut:
    an item id sent without the reasoning item it came with is refused by the API)."""
    return str(value or "").split("|", 1)[0]


def _as_chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for chat_key, key in (("prompt_tokens", "input_tokens"),
                          ("completion_tokens", "output_tokens"),
                          ("total_tokens", "total_tokens")):
        if key in usage:
            out[chat_key] = usage[key]
    details = usage.get("input_tokens_details")
    if isinstance(details, Mapping):
        out["prompt_tokens_details"] = {"cached_tokens": details.get("cached_tokens")}
    details = usage.get("output_tokens_details")
    if isinstance(details, Mapping):
        out["completion_tokens_details"] = {"reasoning_tokens": details.get("reasoning_tokens")}
    return out


def _finish(response: Mapping[str, Any]) -> str | None:
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return "length" if reason == "max_output_tokens" else (
            reason if isinstance(reason, str) else "length")
    if status == "completed":
        output = response.get("output") or []
        called = any(isinstance(item, Mapping) and item.get("type") == "function_call"
                     for item in output)
        return "tool_calls" if called else "stop"
    return None


def _error(error: Mapping[str, Any]) -> dict[str, Any]:
    return {"message": str(error.get("message", "")), "type": error.get("type"),
            "code": error.get("code")}


RESPONSES = Responses()

"""The fake upstream's other two dialects: OpenAI Responses (``/v1/responses``) and Anthropic
Messages (``/v1/messages``), answered from the same ``Reply`` script as chat completions.

A request is read into a chat-completions view (``chat_view``: system, user, assistant with
``tool_calls``, ``tool`` messages, ``tools``, ``max_tokens``) so the scripted behaviour of
``fake_behaviour`` (tool calls, summaries, overflow) works unchanged; the answer is rendered in
the request's dialect with its real event sequence:

- Responses: ``response.created``, ``response.in_progress``, per output item
  ``response.output_item.added`` ... ``response.output_item.done`` (a ``reasoning`` item with its
  summary events and ``encrypted_content``; a ``message`` with ``content_part.added``,
  ``output_text.delta``..., ``output_text.done``, ``content_part.done``; a ``function_call`` with
  ``function_call_arguments.delta``/``.done``), then ``response.completed`` (or
  ``response.incomplete`` for ``finish="length"``) carrying the whole response with usage; every
  event has a ``sequence_number``. A ``stream_error`` ends the stream with ``response.failed``
  (or an ``error`` event with ``stream_error_event="error"``).
- Anthropic: ``message_start`` (input usage), per block ``content_block_start``, ``ping`` after
  the first start, ``content_block_delta`` (``thinking_delta`` + ``signature_delta``,
  ``text_delta``, ``input_json_delta``), ``content_block_stop``; ``message_delta`` (stop_reason,
  ``usage.output_tokens``), ``message_stop``. A ``stream_error`` ends it with ``event: error``.

Usage in the chat shape (the ``Reply`` default, ``size_usage``) is converted; usage already in
the dialect's shape (``input_tokens``) is sent as given.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from tests.fake_upstream import Reply

RESPONSES = "responses"
MESSAGES = "messages"
_OVERFLOW = re.compile(r"maximum context length is (\d+) tokens\. However, your messages "
                       r"resulted in (\d+) tokens")
_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                          403: "permission_error", 404: "not_found_error",
                          413: "request_too_large", 429: "rate_limit_error",
                          500: "api_error", 529: "overloaded_error"}


def dialect_of(path: str) -> str | None:
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/messages"):
        return MESSAGES
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _function(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}


def chat_view(payload: dict[str, Any], dialect: str) -> dict[str, Any]:
    """The request as chat completions would carry it (for the scripted behaviour)."""
    messages: list[dict[str, Any]] = []

    def call(call_id: Any, name: Any, arguments: str) -> None:
        entry = {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": arguments}}
        if not messages or messages[-1].get("role") != "assistant":
            messages.append({"role": "assistant", "content": ""})
        messages[-1].setdefault("tool_calls", []).append(entry)

    if dialect == RESPONSES:
        if payload.get("instructions"):
            messages.append({"role": "system", "content": payload["instructions"]})
        items = payload.get("input")
        for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
            kind = item.get("type", "message")
            if kind == "message":
                role = "system" if item.get("role") == "developer" else item.get("role")
                messages.append({"role": role, "content": _text(item.get("content"))})
            elif kind == "function_call":
                call(item.get("call_id"), item.get("name"), item.get("arguments", ""))
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": _text(item.get("output"))})
        tools = [_function(t.get("name"), t.get("description"), t.get("parameters"))
                 for t in payload.get("tools") or [] if t.get("type") == "function"]
        limit = payload.get("max_output_tokens")
    else:
        if payload.get("system"):
            messages.append({"role": "system", "content": _text(payload["system"])})
        for message in payload.get("messages") or []:
            content = message.get("content")
            if isinstance(content, str):
                messages.append({"role": message.get("role"), "content": content})
                continue
            texts = []
            for block in content or []:
                kind = block.get("type")
                if kind == "text":
                    texts.append(block.get("text", ""))
                elif kind == "tool_use":
                    call(block.get("id"), block.get("name"),
                         orjson.dumps(block.get("input", {})).decode())
                elif kind == "tool_result":
                    messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                     "content": _text(block.get("content"))})
            if texts and message.get("role") == "assistant" and messages and \
                    messages[-1].get("role") == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["content"] = "\n".join(texts)
            elif texts or not content:
                messages.append({"role": message.get("role"), "content": "\n".join(texts)})
        tools = [_function(t.get("name"), t.get("description"), t.get("input_schema"))
                 for t in payload.get("tools") or [] if "name" in t]
        limit = payload.get("max_tokens")
    return {"model": payload.get("model", "fake-model"), "messages": messages, "tools": tools,
            "max_tokens": limit}


def usage(dialect: str, chat: dict[str, Any] | None) -> dict[str, Any]:
    chat = chat or {}
    if "input_tokens" in chat:
        return chat
    prompt = int(chat.get("prompt_tokens", 0))
    completion = int(chat.get("completion_tokens", 0))
    cached = int((chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    if dialect == RESPONSES:
        reasoning = int((chat.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": reasoning},
                "total_tokens": prompt + completion}
    # Anthropic's input_tokens leaves out what was read from (or written to) the cache.
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": completion}


def error_body(dialect: str, error: dict[str, Any] | None, status: int) -> dict[str, Any]:
    """A scripted error in the dialect's shape; the chat wording of an overflow is reworded."""
    error = dict(error or {"message": "scripted failure", "type": "server_error"})
    overflow = _OVERFLOW.search(str(error.get("message", "")))
    if dialect == RESPONSES:
        if error.get("code") == "context_length_exceeded":
            error.update(message="Your input exceeds the context window of this model. Please "
                                 "adjust your input and try again.", param="input")
        return {"error": {"message": error.get("message"), "type": error.get("type"),
                          "param": error.get("param"), "code": error.get("code")}}
    if overflow:
        error = {"type": "invalid_request_error",
                 "message": f"prompt is too long: {overflow.group(2)} tokens > "
                            f"{overflow.group(1)} maximum"}
    kind = error.get("type")
    if kind not in _ANTHROPIC_ERROR_TYPES.values():
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.get("message", "")}}


def _tool_id(dialect: str, call_id: str) -> str:
    if dialect == MESSAGES and call_id.startswith("call_"):
        return "toolu_" + call_id.removeprefix("call_")
    return call_id


def _pieces(text: str, count: int) -> list[str]:
    step = max(1, len(text) // max(count, 1))
    return [text[i:i + step] for i in range(0, len(text), step)]


def _renderers() -> tuple[Any, Any]:
    """The two renderers, imported late: they import this module's helpers."""
    try:
        from tests import fake_anthropic, fake_responses
    except ModuleNotFoundError:  # run as a script: python tests/fake_upstream.py
        import fake_anthropic  # type: ignore[no-redef]
        import fake_responses  # type: ignore[no-redef]
    return fake_anthropic, fake_responses


def final_body(dialect: str, payload: dict[str, Any], reply: Reply, ident: str
               ) -> dict[str, Any]:
    anthropic, responses = _renderers()
    body: dict[str, Any] = (responses.response_body(payload, reply, ident) if dialect == RESPONSES
                            else anthropic.message_body(payload, reply, ident))
    return body


def events(dialect: str, payload: dict[str, Any], reply: Reply, ident: str) -> list[bytes]:
    anthropic, responses = _renderers()
    chunks: list[bytes] = (responses.responses_events(payload, reply, ident)
                           if dialect == RESPONSES
                           else anthropic.messages_events(payload, reply, ident))
    return chunks

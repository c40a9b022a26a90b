"""What the model was sent, as the GenAI conventions' content attributes: only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` asks for it.

``gen_ai.system_instructions`` (the system and developer messages' parts) and
``gen_ai.input.messages`` (the rest, each ``{"role", "parts"}``), as JSON strings, from the
chat messages tailfloor sent upstream: the request as the model saw it, the floor's restored
messages and a compaction's summary included. Parts are ``text``, ``tool_call`` (id, name,
arguments) and ``tool_call_response`` (id, response); an image is a ``uri`` part for an http(s)
URL and a ``blob`` part without its bytes for inline data, which would be most of a span.
The answer is not captured: tailfloor relays it without keeping it.

Each value is cut to ``limit`` characters (OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or
OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, as the SDK does: a cut value is no longer valid JSON).
Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = ["content_attributes"]

Part = dict[str, Any]
_INSTRUCTIONS = frozenset({"system", "developer"})


def content_attributes(messages: Sequence[Any], limit: int) -> list[tuple[str, str]]:
    """The content attributes of ``messages`` (chat-shaped), each at most ``limit`` long."""
    instructions: list[Part] = []
    inputs: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else "user"
        parts = _parts(message)
        if role in _INSTRUCTIONS:
            instructions.extend(parts)
        elif role == "tool":
            inputs.append({"role": "tool", "parts": [{
                "type": "tool_call_response", "id": _text(message.get("tool_call_id")),
                "response": "".join(p.get("content", "") for p in parts
                                    if p.get("type") == "text")}]})
        else:
            inputs.append({"role": role, "parts": parts})
    found = []
    if instructions:
        found.append(("gen_ai.system_instructions", _json(instructions, limit)))
    if inputs:
        found.append(("gen_ai.input.messages", _json(inputs, limit)))
    return found


def _parts(message: Mapping[str, Any]) -> list[Part]:
    content = message.get("content")
    parts: list[Part] = []
    if isinstance(content, str):
        if content:
            parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping):
                part = _block(block)
                if part is not None:
                    parts.append(part)
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            parts.append({"type": "tool_call", "id": _text(call.get("id")),
                          "name": _text(function.get("name")),
                          "arguments": _arguments(function.get("arguments"))})
    return parts


def _block(block: Mapping[str, Any]) -> Part | None:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "content": block["text"]}
    if kind == "image_url":
        image = block.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            return {"type": "uri", "modality": "image", "uri": url}
        mime = url[5:].split(";", 1)[0] if isinstance(url, str) and url.startswith("data:") \
            else None
        return {"type": "blob", "modality": "image", "mime_type": mime or None}
    if kind == "input_audio":
        return {"type": "blob", "modality": "audio"}
    return None


def _arguments(raw: object) -> object:
    """A tool call's arguments as the object they encode, when they are JSON."""
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _json(value: object, limit: int) -> str:
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:  # a lone surrogate, an integer past 64 bits: escaped
        text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit]

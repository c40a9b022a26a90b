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
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

__all__ = ["content_attributes", "held_bytes"]

Part = dict[str, Any]
_INSTRUCTIONS = frozenset({"system", "developer"})
_MIME = re.compile(r"[A-Za-z0-9.+-]{1,40}/[A-Za-z0-9.+-]{1,60}")


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


def held_bytes(value: object, most: int, *, objects: int = 4096) -> int | None:
    """The bytes parsed JSON ``value`` holds: each object's own size (``sys.getsizeof``),
    containers, keys and values, an object reached twice counted twice, so never less than
    what keeping ``value`` costs. The body's length is no measure: parsed, a body weighs from
    about its length (long strings) to twenty times it (small objects). Counting stops once
    past ``most`` (the answer is then some number over it), and after ``objects`` objects
    (None: too many to weigh here; it runs on the request path, a fraction of a microsecond
    an object)."""
    size = sys.getsizeof
    total = 0
    stack: list[Any] = [value]
    while stack:
        objects -= 1
        if objects < 0:
            return None
        item = stack.pop()
        total += size(item)
        if total > most:
            break
        kind = type(item)  # parsed JSON: exact types, and faster than isinstance
        if kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return total


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
            return {"type": "uri", "modality": "image", "uri": _plain_url(url)}
        mime = None
        if isinstance(url, str) and url.startswith("data:"):
            # data:[<mime>][;base64],<bytes>: the type only, and only when it is one
            found = url[5:].split(",", 1)[0].split(";", 1)[0]
            mime = found if _MIME.fullmatch(found) else None
        return {"type": "blob", "modality": "image", "mime_type": mime}
    if kind == "input_audio":
        return {"type": "blob", "modality": "audio"}
    return None


def _arguments(raw: object) -> object:
    """A tool call's arguments as the object they encode, when they are JSON that encodes
    again (orjson reads 1024 levels deep but writes 255: deeper stays the string)."""
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
            orjson.dumps(parsed, option=orjson.OPT_NON_STR_KEYS)
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            return raw
        return parsed
    return raw


def _plain_url(url: str) -> str:
    """An image URL without its user, password, query or fragment (a presigned URL's
    signature sits in its query)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _json(value: object, limit: int) -> str:
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:  # a lone surrogate, an integer past 64 bits: escaped
        try:
            text = json.dumps(value, default=str)
        except (RecursionError, ValueError, TypeError):  # content nested past all reason
            text = json.dumps("[tailfloor: content that cannot be encoded]")
    return text if len(text) <= limit else text[:limit]

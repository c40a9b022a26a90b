"""What a page shows of a message without its text: role, size, tool names, a short hash.

Worked out when a page asks (``proxy.inspector.facts``), for every message of every request
it shows. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

import orjson

__all__ = ["MessageDigest", "clean", "digest_of", "encoded", "role_of", "short_hash",
           "tools_of"]


_WHOLE = 4096
_EDGE = 2048


class MessageDigest(NamedTuple):
    """A message without its text."""

    role: str
    size: int  # bytes of its JSON form, as sent
    hash: str
    tools: tuple[str, ...]


def digest_of(message: Any) -> MessageDigest:
    """Every message of every kept request is digested: a long text content is hashed by
    its length and edges, not read in full or serialised again (a 40 KB system prompt in
    full would cost more than the rest of the inspector). ``size``: bytes of its JSON form."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str) and len(content) > _WHOLE:
        stand_in = _edges(content)
        data = encoded({**message, "content": stand_in})
        size = len(data) - len(stand_in) + len(content.encode("utf-8", "surrogatepass"))
    else:
        data = encoded(message)
        size = len(data)
    return MessageDigest(role_of(message), size, short_hash(data), tuple(tools_of(message)))


def _edges(text: str) -> str:
    return f"{len(text)}:{text[:_EDGE]}...{text[-_EDGE:]}"


def short_hash(data: bytes) -> str:
    """blake2b (5 bytes, hex) of a message's JSON form, in which a text content over 4,096
    characters stands as ``<length>:<first 2,048>...<last 2,048>``."""
    return hashlib.blake2b(data, digest_size=5).hexdigest()


def encoded(message: Any) -> bytes:
    try:
        return orjson.dumps(message)
    except TypeError:  # a lone surrogate, or a value JSON has no form for
        try:
            return json.dumps(message, ensure_ascii=False, default=repr).encode(
                "utf-8", "surrogatepass")
        except (RecursionError, ValueError):  # nested deeper than anything should be
            return repr(type(message)).encode()


def role_of(message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    return clean(role) if isinstance(role, str) else "unknown"


def tools_of(message: Any) -> list[str]:
    if not isinstance(message, dict):
        return []
    names = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.append(clean(name))
    name = message.get("name")
    if message.get("role") == "tool" and isinstance(name, str):
        names.append(clean(name))
    return names


def clean(text: str) -> str:
    """Text any encoder takes: a lone surrogate becomes a question mark."""
    return text.encode("utf-8", "replace").decode("utf-8", "replace")

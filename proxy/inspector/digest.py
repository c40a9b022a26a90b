"""What the inspector keeps of a request for good, once it is over.

On the request path the inspector holds the finished request's trail by reference (cheap);
soon after, off the event loop, ``settled`` turns it into a report without the trail, the
bodies or the request's headers: with content off, every message is reduced to its role,
size, tool names and a short hash (``MessageDigest``), so no message text and no credential
stays in memory once the request is settled; with content on, the messages are kept as sent.
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import orjson

from proxy.report import RequestReport

__all__ = ["MessageDigest", "clean", "digest_of", "digests", "encoded", "role_of", "settled",
           "short_hash",
           "tools_of"]


_WHOLE = 4096
_EDGE = 2048


class MessageDigest(NamedTuple):
    """A message without its text."""

    role: str
    size: int  # bytes of its JSON form, as sent
    hash: str
    tools: tuple[str, ...]


def settled(report: RequestReport, content: bool) -> RequestReport:
    """The report as the inspector keeps it: no body; messages as digests unless content
    is kept."""
    if content:
        return replace(report, body=None)
    return replace(report, body=None, messages=digests(report.messages))


def digests(messages: Sequence[Any] | None) -> list[Any] | None:
    return [digest_of(m) for m in messages] if messages else None


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

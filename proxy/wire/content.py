"""Message content as the agents send it, read one way everywhere. Pure.

OpenAI chat content is a string or a list of parts; a part with a string ``text`` is text
(``text``, ``input_text``, ``output_text`` and Pi's transcript blocks all look like that),
anything else (images, audio, files) is not. A request opens with its system/developer
messages (its *head*), then the conversation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeGuard

__all__ = ["content_text", "first_text", "has_role", "head_length", "message_text", "text_parts"]

HEAD_ROLES = frozenset({"system", "developer"})


def _mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # Parsed JSON is always a dict: the exact-type test spares the ABC check's cost on
    # every message of every request.
    return value.__class__ is dict or isinstance(value, Mapping)


def text_parts(content: object) -> Iterator[str]:
    """The texts of a content, in order (a string content is one text)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if _mapping(part):
                text = part.get("text")
                if isinstance(text, str):
                    yield text
            elif isinstance(part, str):
                yield part


def content_text(content: object, sep: str = "\n") -> str:
    """A content's texts joined by ``sep`` (a string content unchanged)."""
    if isinstance(content, str):
        return content
    return sep.join(text_parts(content))


def message_text(message: object) -> str:
    """The text of a message (its content's texts joined by newlines)."""
    if not _mapping(message):
        return ""
    content = message.get("content")
    return content if content.__class__ is str else content_text(content)


def first_text(message: object) -> str | None:
    """The first text of a message: where an agent puts a prefix. None: no text first."""
    if not _mapping(message):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and _mapping(content[0]):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def head_length(messages: Sequence[Any]) -> int:
    """How many leading system/developer messages a request has."""
    n = 0
    for message in messages:  # has_role inlined: this runs on every message of the head
        role = message.get("role") if message.__class__ is dict or isinstance(
            message, Mapping) else None
        if not isinstance(role, str) or role not in HEAD_ROLES:
            break
        n += 1
    return n


def has_role(message: object, roles: frozenset[str]) -> bool:
    """Whether a message from a client's JSON has one of ``roles`` (its role may be any JSON
    value, a dict among them, which a frozenset cannot look up)."""
    role = message.get("role") if _mapping(message) else None
    return isinstance(role, str) and role in roles

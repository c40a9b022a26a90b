"""Top-level members of a JSON request body, changed in place. Pure.

Lowering a request's output limit must leave every other byte as the client sent it: the
messages go upstream byte for byte, so a prompt cache keyed on them still hits and the
upstream counts exactly the prompt it counted before. Serialising the parsed body again would
not promise that (escapes, number formats, key order), so the value is replaced where it sits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import orjson

__all__ = ["OUTPUT_KEYS", "with_member", "with_output_limit"]

# The names a chat request gives its output limit (the first one set counts, as in tokens.py).
OUTPUT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_SPACE = b" \t\r\n"
_NUMBER = frozenset(b"-+.eE0123456789")
# Jumps to the next byte that matters, so a multi-megabyte messages array is crossed by the
# regex engine rather than byte by byte.
_STRING_STOP = re.compile(rb'["\\]')
_CONTAINER_STOP = re.compile(rb'["{}\[\]]')


def _skip_space(raw: bytes, at: int) -> int:
    while at < len(raw) and raw[at] in _SPACE:
        at += 1
    return at


def _string_end(raw: bytes, at: int) -> int:
    """Index after the string that opens at ``at`` (a quote)."""
    at += 1
    while (stop := _STRING_STOP.search(raw, at)) is not None:
        at = stop.start()
        if raw[at] == 0x22:
            return at + 1
        at += 2  # a backslash: the next byte is escaped
    raise ValueError("unterminated string")


def _value_end(raw: bytes, at: int) -> int:
    """Index after the JSON value that starts at ``at``."""
    first = raw[at]
    if first == 0x22:
        return _string_end(raw, at)
    if first in b"{[":
        depth = 0
        while (stop := _CONTAINER_STOP.search(raw, at)) is not None:
            at = stop.start()
            byte = raw[at]
            if byte == 0x22:
                at = _string_end(raw, at)
                continue
            depth += 1 if byte in b"{[" else -1
            at += 1
            if depth == 0:
                return at
        raise ValueError("unterminated container")
    while at < len(raw) and raw[at] not in b",}] \t\r\n":
        at += 1
    return at


def _member_spans(raw: bytes) -> Iterable[tuple[str, int, int]]:
    """(key, value start, value end) of each member of the top-level object."""
    at = _skip_space(raw, 0)
    if at >= len(raw) or raw[at] != 0x7B:
        raise ValueError("not a JSON object")
    at = _skip_space(raw, at + 1)
    while at < len(raw) and raw[at] != 0x7D:
        key_end = _string_end(raw, at)
        key = orjson.loads(raw[at:key_end])
        at = _skip_space(raw, key_end)
        if raw[at] != 0x3A:
            raise ValueError("expected ':'")
        start = _skip_space(raw, at + 1)
        end = _value_end(raw, start)
        yield key, start, end
        at = _skip_space(raw, end)
        if at < len(raw) and raw[at] == 0x2C:
            at = _skip_space(raw, at + 1)
    if at >= len(raw):
        raise ValueError("unterminated object")


def with_output_limit(raw: bytes, limit: int) -> bytes | None:
    """``raw`` with every output-limit member above ``limit`` lowered to it, nothing else
    changed. None when the body holds no whole-number output limit above ``limit`` or is not
    a JSON object this can read."""
    try:
        spans = [(start, end) for key, start, end in _member_spans(raw)
                 if key in OUTPUT_KEYS and all(b in _NUMBER for b in raw[start:end])]
        values = [(start, end, orjson.loads(raw[start:end])) for start, end in spans]
        lowered = [(start, end) for start, end, value in values
                   if isinstance(value, int) and value > limit]
    except (ValueError, IndexError):  # orjson.JSONDecodeError is a ValueError
        return None
    if any(isinstance(v, float) and v > limit for _s, _e, v in values):
        return None  # a limit this cannot lower in place would still ask for too much
    if not lowered:
        return None
    out = bytearray()
    last = 0
    for start, end in lowered:
        out += raw[last:start] + str(limit).encode()
        last = end
    return bytes(out + raw[last:])


def with_member(raw: bytes, key: str, value: bytes) -> bytes | None:
    """``raw`` with the value of its top-level member ``key`` (each copy) replaced by
    ``value`` (JSON), nothing else changed. None when there is no such member or ``raw`` is
    not a JSON object this can read."""
    try:
        spans = [(start, end) for name, start, end in _member_spans(raw) if name == key]
    except (ValueError, IndexError):
        return None
    if not spans:
        return None
    out = bytearray()
    last = 0
    for start, end in spans:
        out += raw[last:start] + value
        last = end
    return bytes(out + raw[last:])

"""Stable fingerprints of chat messages, and a chain over them that names a prefix.

A stored compaction says "these first N messages are summarized by S". The agent keeps sending
its whole history, so a later request starts with the same N messages; chaining the message
fingerprints (``chain_k = H(chain_{k-1} + fp_k)``) turns "does this request start with those
N messages" into one lookup of ``chain_N``.

The canonical form keeps what the model reads and drops what agents re-render differently
between requests: role, the text (a string and a list of text parts read the same), images by
a hash of their URL, tool calls by id, name and arguments (JSON re-serialized with sorted keys,
since agents re-serialize arguments from stored objects), and the ``tool_call_id`` of results.
Tool-call ids are compared by the key all their wire forms share (``proxy.wire.tool_ids``):
Pi rewrites ids for another model and OpenClaw drops underscores. Reasoning fields are left
out: agents drop or keep them depending on the model.

Pure: hashing only (``KeptFingerprints`` remembers the fingerprints of long texts).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from proxy.wire.tool_ids import call_id_key

__all__ = ["KeptFingerprints", "chain_fingerprint", "message_fingerprint", "prefix_chain"]

_DIGEST_SIZE = 16  # 128 bits: collisions are not a concern at any realistic store size


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).hexdigest()


def _sorted_json(value: object) -> str:
    return _sorted_json_bytes(value).decode()


def _sorted_json_bytes(value: object) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except TypeError:  # integers beyond 64 bits or lone surrogates, which orjson refuses
        return json.dumps(value, sort_keys=True, default=str).encode()


def _content(content: object) -> list[Any]:
    if isinstance(content, str):
        return [content] if content else []
    if not isinstance(content, list):
        return []
    parts: list[Any] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping):
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
            elif part.get("type") == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                parts.append(["image", _digest(str(url).encode())])
            else:
                parts.append(["part", _digest(_sorted_json_bytes(part))])
    # adjacent text parts read as one text, so "a\nb" and ["a", "b"] fingerprint the same;
    # each run joined once (appending to the last text copied it: quadratic in the parts)
    merged: list[Any] = []
    run: list[str] = []
    for item in parts:
        if isinstance(item, str):
            run.append(item)
            continue
        if run:
            merged.append("\n".join(run))
            run = []
        merged.append(item)
    if run:
        merged.append("\n".join(run))
    return merged


def _arguments(raw: object) -> str:
    value = raw
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return _sorted_json(value)


def _calls(calls: object) -> list[list[str]]:
    if not isinstance(calls, list):
        return []
    out: list[list[str]] = []
    for call in calls:
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        out.append([call_id_key(call.get("id")), str(function.get("name", "")),
                    _arguments(function.get("arguments"))])
    return out


def message_fingerprint(msg: Mapping[str, Any]) -> str:
    """128-bit hex fingerprint of what the model reads from one message."""
    canonical = [
        str(msg.get("role", "")),
        _content(msg.get("content")),
        _calls(msg.get("tool_calls")),
        call_id_key(msg.get("tool_call_id")),
    ]
    # The bytes hashed as they are written: a message of megabytes is not decoded into a
    # string and encoded back (two more copies of it) on the way.
    return _digest(_sorted_json_bytes(canonical))


class KeptFingerprints:
    """The fingerprints of messages whose whole content is one long string: an agent repeats
    its 2-40 KB system prompt in every request, and hashing it again costs ~1.6 ns a byte
    (65 us for 40 KB), where the lookup costs the string's own hash, which the request's other
    lookups share. Keyed by the exact role and text, so a hit is never another message's; at
    most ``budget`` bytes of text are kept (all forgotten at once past it)."""

    MIN_TEXT = 2048  # shorter texts hash faster than they are looked up

    def __init__(self, budget: int = 4 * 1024 * 1024) -> None:
        self._budget = budget
        self._held = 0
        self._kept: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()  # requests with large bodies are viewed in worker threads

    def of(self, message: Mapping[str, Any]) -> str:
        content, role = message.get("content"), message.get("role")
        if (content.__class__ is not str or len(content) < self.MIN_TEXT
                or role.__class__ is not str or len(message) != 2):
            return message_fingerprint(message)
        key = (role, content)
        found = self._kept.get(key)
        if found is None:
            found = message_fingerprint(message)
            if len(content) <= self._budget:
                with self._lock:
                    if self._held + len(content) > self._budget:
                        self._kept.clear()
                        self._held = 0
                    self._kept[key] = found
                    self._held += len(content)
        return found


def chain_fingerprint(previous: str, fingerprint: str) -> str:
    return _digest(f"{previous}:{fingerprint}".encode())


def prefix_chain(messages: Sequence[Mapping[str, Any]] | Iterable[Mapping[str, Any]]) -> list[str]:
    """``result[k]`` names the prefix ``messages[:k + 1]``."""
    chain: list[str] = []
    previous = ""
    for message in messages:
        previous = chain_fingerprint(previous, message_fingerprint(message))
        chain.append(previous)
    return chain

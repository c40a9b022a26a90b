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

Pure: hashing only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from proxy.wire.tool_ids import call_id_key

__all__ = ["chain_fingerprint", "message_fingerprint", "prefix_chain"]

_DIGEST_SIZE = 16  # 128 bits: collisions are not a concern at any realistic store size


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).hexdigest()


def _sorted_json(value: object) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()
    except TypeError:  # integers beyond 64 bits or lone surrogates, which orjson refuses
        return json.dumps(value, sort_keys=True, default=str)


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
                parts.append(["part", _digest(_sorted_json(part).encode())])
    # adjacent text parts read as one text, so "a\nb" and ["a", "b"] fingerprint the same
    merged: list[Any] = []
    for item in parts:
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += "\n" + item
        else:
            merged.append(item)
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
    return _digest(_sorted_json(canonical).encode())


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

"""Asking a streamed chat request for its usage, changing as few of its bytes as possible.
Pure: a byte-level edit of the request body."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.wire.members import with_member

__all__ = ["with_stream_usage"]

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true}'


def with_stream_usage(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """The request body with ``stream_options.include_usage`` set, changing as little as possible.

    Appending one member to the JSON object keeps every other byte as the client sent it; when
    the client already sent ``stream_options``, only that member's value is replaced. None when
    that cannot be done: send it as it is.
    """
    if "stream_options" not in body:
        end = raw.rstrip()
        if end.endswith(b"}"):
            inner = end[:-1].rstrip()
            separator = b"" if inner.endswith(b"{") else b","
            return inner + separator + _INCLUDE_USAGE + b"}"
    # ``raw`` may be a rewrite (a compaction, a lowered output limit) of the client's body:
    # only the stream_options member changes, in place; the rest stays what was planned.
    options = body.get("stream_options")
    merged = dict(options) if isinstance(options, dict) else {}
    merged["include_usage"] = True
    try:
        return with_member(raw, "stream_options", orjson.dumps(merged))
    except (orjson.JSONEncodeError, TypeError):
        return None

"""Asking streaming upstreams for usage, and remembering the ones that refuse it.

A streaming chat request without ``stream_options.include_usage`` gets it added (tailfloor
needs the usage); an upstream that answers 400 naming ``stream_options`` is remembered as
refusing it, per upstream and for a while only (an upstream can be upgraded), and the request
is sent again as the client sent it. Another 400 (one that does not name the field, from a
client's bad request) changes nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import orjson

__all__ = ["StreamOptionsMemory", "names_stream_options"]

REMEMBER_SECONDS = 600.0
_REFUSALS = ("unrecognized", "unknown", "unsupported", "not supported", "extra", "not allowed",
             "not permitted", "invalid", "unexpected")


def names_stream_options(body: bytes) -> bool:
    """Whether an error answer says that ``stream_options`` itself is not accepted."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body[:2048].decode("utf-8", "replace").lower()
        return "stream_options" in text and any(word in text for word in _REFUSALS)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, dict):
        return False
    if error.get("param") == "stream_options":
        return True
    message = str(error.get("message", "")).lower()
    return "stream_options" in message and any(word in message for word in _REFUSALS)


class StreamOptionsMemory:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._refused_until: dict[str, float] = {}
        # Upstreams found refusing here, for a shared store to pass on to the other replicas.
        self.refusals: deque[str] = deque(maxlen=64)
        # Called after each refusal found here (a shared store passes it on at once).
        self.on_learned: Callable[[], None] = lambda: None

    def accepted(self, upstream: str) -> bool:
        until = self._refused_until.get(upstream)
        if until is None:
            return True
        if until <= self._clock():
            del self._refused_until[upstream]
            return True
        return False

    def refused(self, upstream: str) -> None:
        self.merge(upstream, REMEMBER_SECONDS)
        self.refusals.append(upstream)
        self.on_learned()

    def merge(self, upstream: str, seconds: float) -> None:
        """Another replica found ``upstream`` refusing; remember it for ``seconds``."""
        if seconds > 0 and len(self._refused_until) < 1024:
            until = self._clock() + min(seconds, REMEMBER_SECONDS)
            self._refused_until[upstream] = max(until, self._refused_until.get(upstream, 0.0))

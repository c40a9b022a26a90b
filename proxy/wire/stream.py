"""Server-sent events of an OpenAI-compatible stream, line by line. Pure."""

from __future__ import annotations

__all__ = ["DONE", "event_data"]

DONE = b"[DONE]"


def event_data(line: bytes) -> bytes | None:
    """The payload of a ``data:`` line (stripped), None for any other line."""
    if not line.startswith(b"data:"):
        return None
    return line[5:].strip()

"""What the upstream answered, as the stages read it: a complete answer recovery looks at, the
answer tailfloor gives instead, and how an answer ended. Plain records, pure."""

from __future__ import annotations

from typing import Any

from proxy.values import frozen_value
from proxy.wire.usage import Usage

__all__ = ["AnswerSeen", "ErrorReply", "UpstreamAnswer"]


@frozen_value
class UpstreamAnswer:
    """A complete non-streamed upstream answer (an error, when recovery looks at it)."""

    status: int
    content_type: str | None
    body: bytes


@frozen_value
class ErrorReply:
    """An answer tailfloor gives the client itself instead of the upstream's."""

    status: int
    body: bytes


@frozen_value
class AnswerSeen:
    """How an answer ended, for checks after the fact (silent overflow)."""

    status: int
    usage: Usage | None
    finish_reason: str | None
    stream_error: dict[str, Any] | None

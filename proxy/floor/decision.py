"""What the floor decided for one request, as a value (the stage returns it, the caller
records metrics from it, the preview shows it), and the small message edits it makes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal

from proxy.chat import ChatRequest
from proxy.report import Origin
from proxy.transcripts.records import SessionRecord
from proxy.values import frozen_value

__all__ = ["Decision", "DecisionKind", "annotate", "pass_through", "public_verdict",
           "summary_of"]

Message = dict[str, Any]
DecisionKind = Literal["floor", "carry", "shadow", "none", "off"]


@frozen_value
class Decision:
    """What the floor decided for one request (the preview shows it as it is)."""

    kind: DecisionKind
    verdict: str  # the x-tailfloor text
    body: bytes
    method: str | None = None  # identification outcome (metrics label); None: not tried
    session_id: str | None = None
    source_session: str | None = None
    messages: tuple[Message, ...] | None = None
    origins: tuple[Origin, ...] | None = None  # where each of ``messages`` came from
    added: tuple[Message, ...] = ()
    added_raw: int = 0
    added_tokens: int = 0
    capped: bool = False
    window: int | None = None
    would: str | None = None  # shadow: the verdict enforce mode would have given
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a failure inside the floor (the request passed through)

    @property
    def added_to_request(self) -> bool:
        """Messages went into what is sent (not a pass-through, not shadow mode)."""
        return self.kind in ("floor", "carry")


def pass_through(chat: ChatRequest, reason: str, method: str | None, session_id: str | None = None,
         *, capped: bool = False) -> Decision:
    """The request goes upstream as the client sent it, and why."""
    return Decision("none", f"none; reason={reason}", chat.raw, method=method,
                    session_id=session_id, capped=capped)


# Reasons a pass-through may tell any client: about the request itself, never about whether
# its text matched a session (which would make the header a membership oracle).
_PUBLIC_REASONS = frozenset({
    "too_large", "too_deep", "summarization", "no_messages", "no_transcripts", "error",
    "server_state", "message_thread", "unsupported_item", "unauthenticated", "clean_slate",
    "indexing"})


def public_verdict(verdict: str) -> str:
    """The ``x-tailfloor`` verdict as any client may read it: a pass-through's reason only
    when it says nothing about the sessions tailfloor knows (the full verdict goes to the
    logs and the inspector, and to clients with ``--tailfloor-header detailed``)."""
    head, sep, reason = verdict.partition("; reason=")
    if sep and reason not in _PUBLIC_REASONS:
        return head
    return verdict


def summary_of(record: SessionRecord | None) -> str | None:
    """The summary of a session's last compaction, if it has one."""
    if record is None or record.compaction is None:
        return None
    return record.compaction.summary or None


def annotate(summary: object, note: str) -> Message:
    """The agent's summary message with the note that the raw tail follows it."""
    message = dict(summary) if isinstance(summary, Mapping) else {"role": "user"}
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = content + "\n\n" + note
    elif isinstance(content, list):
        parts = list(content)
        at = next((i for i, p in enumerate(parts) if isinstance(p, Mapping)
                   and "</summary>" in str(p.get("text", ""))), None)
        if at is None:
            parts.append({"type": "text", "text": note})
        else:
            parts[at] = {**parts[at], "text": str(parts[at]["text"]) + "\n\n" + note}
        message["content"] = parts
    return message

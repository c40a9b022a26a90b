"""A compacted request as a value: its messages, its body and what it removed.

``summarized``: the head, one summary in place of ``conversation[:covered]``, the raw tail.
``dropped``: the summarizer failed, so the oldest messages go instead, with a note saying so.

Pure: the token counter is handed in; nothing is sent or stored here.
"""

from __future__ import annotations

import orjson

from proxy.recovery.outcome import Compaction, SummaryAttempt, Trigger
from proxy.recovery.plan import (
    Cut,
    Message,
    Prior,
    compacted_messages,
    fallback_messages,
    runtime_line,
)
from proxy.recovery.request import RecoveryRequest
from proxy.report import Origin
from proxy.tokens import TokenCounter, with_margin

__all__ = ["dropped", "summarized"]


def summarized(request: RecoveryRequest, tokens: TokenCounter, summary: str, covered: int,
               trigger: Trigger, *, label: str, why: str, attempt: SummaryAttempt | None = None,
               store_error: str | None = None) -> Compaction:
    head, draft = len(request.head), request.draft
    # The pins the floor put in the part summarized stay raw, right after the summary.
    pinned = [i for i in range(covered) if draft.origin(head + i).provenance == "pinned"]
    messages = compacted_messages(request.head, summary, request.conversation[covered:],
                                  request.policy.notes.summary_followed,
                                  runtime_line(request.conversation))
    messages[head + 1:head + 1] = [request.conversation[i] for i in pinned]
    origins = (*(draft.origin(i) for i in range(head)), _ours(covered),
               *(draft.origin(head + i) for i in pinned),
               *(draft.origin(head + i) for i in range(covered, len(request.conversation))))
    return _compaction(request, tokens, messages, trigger, label, why=why, covered=covered,
                       attempt=attempt, store_error=store_error, origins=origins)


def _ours(covered: int) -> Origin:
    """tailfloor's summary of the request's first ``covered`` conversation messages."""
    return Origin("summary", author="tailfloor", replaced=covered,
                  replaced_span=("#1", f"#{covered}"))


def dropped(request: RecoveryRequest, tokens: TokenCounter, prior: Prior, cut: Cut,
            costs: list[int], *, trigger: Trigger, why: str,
            attempt: SummaryAttempt) -> Compaction:
    messages = fallback_messages(request.head, request.conversation, prior, cut.keep,
                                 sum(costs[prior.covered:cut.keep]),
                                 note=request.policy.notes.summary_followed)
    head, draft, conversation = len(request.head), request.draft, request.conversation
    kept = len(conversation) - cut.keep
    # Between the head and the kept tail: the summary already there (the agent's own first
    # message, or tailfloor's stored one), then the note saying what was dropped.
    between = len(messages) - head - kept
    summary: tuple[Origin, ...] = ()
    if between == 2:
        summary = (draft.origin(head),) if prior.covered == 1 else (_ours(prior.covered),)
    origins = (*(draft.origin(i) for i in range(head)), *summary, Origin("inserted"),
               *(draft.origin(head + i) for i in range(cut.keep, len(conversation))))
    return _compaction(request, tokens, messages, trigger, f"dropped:{trigger}", why=why,
                       covered=cut.keep, attempt=attempt, origins=origins)


def _compaction(request: RecoveryRequest, tokens: TokenCounter, messages: list[Message],
                trigger: Trigger, label: str, *, why: str, covered: int,
                attempt: SummaryAttempt | None, store_error: str | None = None,
                origins: tuple[Origin, ...] | None = None) -> Compaction:
    encoding = request.spec.encoding
    before = sum(request.costs(tokens))
    after = sum(tokens.per_message(messages[len(request.head):], encoding))
    # in the upstream's units as far as we can tell: non-OpenAI tokenizers count more
    removed = with_margin(max(before - after, 0), request.spec.margin)
    return Compaction(
        body=orjson.dumps({**request.chat.body, "messages": messages}),
        messages=tuple(messages), trigger=trigger, label=label, why=why,
        session=request.session, replaced=covered,
        kept=len(request.conversation) - covered, tokens_removed=removed,
        window=request.window, summary=attempt, store_error=store_error,
        origins=origins if origins is not None and len(origins) == len(messages) else None)

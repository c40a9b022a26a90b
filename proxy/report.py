"""What one chat request did, as one value: what the recorder hands to its consumers.

The exchange builds a ``RequestReport`` once, when the client has its answer; the recorder
turns it into metrics and log lines, and hands the same value to the inspector (kept
requests, pages on the admin listener) and to telemetry (OTLP spans and metrics). None of
them reaches into a stage: everything they show is here.

``messages`` are the chat messages exactly as the last attempt sent them upstream (the
stages' chat shape; a Responses or Anthropic request went out rendered in its dialect), by
reference: nothing is copied on the request path. ``origins`` says where each came from, one
``Origin`` per message, in the same order (``None``: every message is the agent's own).
Pure: no I/O, no aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from proxy.values import frozen_value
from proxy.wire.usage import Usage

__all__ = ["AGENT", "Attempt", "Origin", "Provenance", "RequestReport", "SummaryMade"]

# The words the inspector, its JSON and the docs use, exactly.
Provenance = Literal["agent", "restored", "carried", "summary", "inserted", "pinned"]
Author = Literal["agent", "tailfloor"]


@frozen_value
class Origin:
    """Where one sent message came from.

    ``session``: for ``carried``, the session it was carried from; for ``restored``, the
    session whose transcript it was read from. ``author`` and ``replaced``: for a
    ``summary``, who wrote it and how many conversation messages it stands for;
    ``replaced_span`` names them when known (first and last transcript entry ids, or
    ``("#<i>", "#<j>")`` positions of the request's conversation for tailfloor's own).
    """

    provenance: Provenance
    session: str | None = None
    author: Author | None = None
    replaced: int | None = None
    replaced_span: tuple[str, str] | None = None


AGENT = Origin("agent")


class Attempt(NamedTuple):
    """One upstream attempt of the request (the first, or the retry after an overflow).

    ``started`` and ``latency`` are seconds from the request's arrival and of the attempt
    until its answer head (``status``) or its failure (``error``: tailfloor's error kind,
    such as ``timeout``, ``connect``, ``overflow``); ``first_chunk`` is seconds from the
    request's arrival to the first byte of a streamed answer's body, when it had one.
    A named tuple: made once per attempt of every request, in one C call.
    """

    number: int
    status: int | None
    started: float
    latency: float
    error: str | None = None
    first_chunk: float | None = None
    body_bytes: int = 0
    compacted: bool = False  # this attempt sent a compaction tailfloor made or reused
    traceparent: str | None = None  # the W3C trace context this attempt sent upstream
    # The last attempt's streamed answer ended short of whole (``StreamOutcome.broke``:
    # timeout, mid_stream, error_event): ``error`` is None, since it ran to the end.
    broke: str | None = None


@frozen_value
class SummaryMade:
    """A summarizer call tailfloor made for this request (all its chunk calls)."""

    model: str
    started: float  # seconds from the request's arrival
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failure: str | None = None
    traceparent: str | None = None  # what its calls sent upstream (spans are exported)


# Not frozen, unlike the others: a frozen dataclass's __init__ sets each of these forty
# fields through object.__setattr__, which cost five times as much as plain slots, and a
# report is built for every request telemetry or prices see. Nothing changes a report
# once made; its consumers only read it.
@dataclass(slots=True)
class RequestReport:
    request_id: str
    at: float  # wall-clock time (epoch seconds) the request arrived
    route: str  # chat_completions | responses | messages
    model: str
    agent: str | None
    stream: bool
    status: int  # what the client got (499: it left before the answer was complete)
    verdict: str  # the x-tailfloor text
    seconds: float  # arrival to the end of the answer
    proxy_seconds: float  # tailfloor's own time in that
    # The fields up to ``trace_id`` are the ones most requests set, in the order
    # ``report_of`` passes them (by position: naming thirty arguments costs more than the
    # rest of the report). The rarer ones, after, are named.
    # Identification: the session the floor tied the request to, how, and the session id
    # the agent itself named (a header or body field; never a derived one).
    session_id: str | None = None
    method: str | None = None
    named_session: str | None = None
    # The floor
    floor_kind: str = "none"  # floor | carry | shadow | none | off
    floor_reason: str | None = None  # why a pass-through passed (the verdict's reason)
    restored: int = 0
    carried: int = 0
    carried_from: str | None = None
    added_tokens: int = 0
    capped: bool = False
    overflow: str | None = None  # tailfloor_overflow_total{outcome} counted for it
    # The upstream
    attempts: tuple[Attempt, ...] = ()
    usage: Usage | None = None  # as the upstream reported it (before any adjustment)
    finish_reason: str | None = None
    response_model: str | None = None  # the model the answer named, as it named it
    window: int | None = None
    traceparent: str | None = None  # what the client sent, when it was valid
    # The trace its spans belong to, as the upstream was told (spans are exported); kept
    # apart from the attempts, since a request cancelled mid-attempt records none.
    trace_id: str | None = None
    # Recovery
    compaction: str | None = None  # its x-tailfloor label: compacted:overflow, reused...
    compaction_why: str | None = None
    replaced: int = 0
    tokens_removed: int = 0
    summary: SummaryMade | None = None
    clamp: tuple[int, int] | None = None  # output limit lowered: (asked, sent)
    # What was sent, by reference (see the module docstring): the chat body the last attempt
    # sent (the bytes the stages made; for a dialect request before it was rendered) and its
    # parsed messages.
    body: bytes | None = None
    messages: tuple[dict[str, Any], ...] | list[Any] | None = None
    origins: tuple[Origin, ...] | None = None

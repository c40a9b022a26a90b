"""A finished request's ``Trail`` as the ``RequestReport`` its consumers read.

References only (the body and messages the last attempt sent), counts and verdicts: nothing is
copied or rendered here; the inspector renders on demand, telemetry turns it into spans.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from proxy.chat import ChatRequest
from proxy.floor.decision import Decision
from proxy.identity.identify import RequestSignals
from proxy.identity.lineage import Lineage
from proxy.recovery.outcome import AfterCheck, ErrorStep
from proxy.report import Attempt, RequestReport, SummaryMade
from proxy.server.outgoing import Outgoing
from proxy.server.relay import StreamOutcome
from proxy.telemetry.tracecontext import TraceContext
from proxy.wire.usage import Usage

__all__ = ["ContextFacts", "TrailFacts", "report_of"]


class ContextFacts(Protocol):
    """What a report reads of the request's context (never its headers)."""

    @property
    def signals(self) -> RequestSignals: ...
    @property
    def lineage(self) -> Lineage: ...
    @property
    def window(self) -> int: ...


class TrailFacts(Protocol):
    """What a report is made from: a request's ``Trail``, or what the inspector keeps of
    one."""

    request_id: str
    at: float
    started: float
    chat: ChatRequest
    decision: Decision | None
    outgoing: Outgoing | None
    steps: tuple[ErrorStep, ...]
    attempts: tuple[Attempt, ...]
    stream: StreamOutcome | None
    usage: Usage | None
    finish_reason: str | None
    response_model: str | None
    after: AfterCheck | None
    proxy_seconds: float
    status: int
    client_gone: bool
    client_traceparent: str | None
    trace: TraceContext | None

    @property
    def ctx(self) -> ContextFacts | None: ...
    @property
    def verdict(self) -> str: ...


def report_of(trail: TrailFacts, seconds: float | None = None, *,
              content: bool = True) -> RequestReport:
    """``seconds``: the request's time, when measured at its end (a report made later);
    ``content``: with the body and messages sent (the inspector's pages show them; a
    report queued for telemetry must not hold them). One constructor call: each
    ``dataclasses.replace`` of a report this wide costs as much as building it, and so
    does naming each argument."""
    chat, ctx, decision, outgoing = trail.chat, trail.ctx, trail.decision, trail.outgoing
    # Locals and one call with every common field by position: a dict of fields merged into the
    # call costs more than the report itself. ``fields``: the rarer ones.
    fields: dict[str, Any] = {}
    session_id = method = named_session = window = None
    if ctx is not None:
        # A header, the prompt cache key or OpenClaw's Runtime line: the agent named it.
        signals, lineage = ctx.signals, ctx.lineage
        session_id, method, window = lineage.session_id, lineage.method, ctx.window
        named_session = signals.session_id if signals.session_source is not None else None
        agent = signals.agent_id
    else:
        agent = chat.agent_id
    floor_kind, floor_reason, carried_from, capped = "none", None, None, False
    restored = carried = added_tokens = 0
    if decision is not None:
        # One call, not a search and a split (a list) for a pass-through's reason.
        _, found_reason, reason = decision.verdict.partition("reason=")
        floor_reason = reason if found_reason else None
        floor_kind = decision.kind
        if floor_kind == "floor":  # added to the request: decision.added_to_request
            restored, added_tokens = decision.added_raw, decision.added_tokens
        elif floor_kind == "carry":
            carried, carried_from = decision.added_raw, decision.source_session
            added_tokens = decision.added_tokens
        capped = decision.capped
        session_id = session_id or decision.session_id
    if outgoing is not None:
        if content:
            found = chat.body.get("messages")
            messages = outgoing.messages if outgoing.messages is not None \
                else found if isinstance(found, list) else None
            fields.update(body=outgoing.body, origins=outgoing.origins, messages=messages)
        compaction = outgoing.compaction
        if compaction is not None:
            fields.update(compaction=compaction.label, compaction_why=compaction.why,
                          replaced=compaction.replaced, tokens_removed=compaction.tokens_removed)
            window = compaction.window
            made = compaction.summary
            if made is not None:
                fields["summary"] = SummaryMade(
                    model=made.model, seconds=made.seconds,
                    started=made.began - trail.started if made.began else 0.0,
                    prompt_tokens=made.prompt_tokens, completion_tokens=made.completion_tokens,
                    failure=made.failure, traceparent=made.traceparent)
        if outgoing.clamp is not None:
            fields["clamp"] = (outgoing.clamp.requested, outgoing.clamp.limit)
    steps = trail.steps
    overflow = next((s.overflow for s in reversed(steps) if s.overflow), None) if steps \
        else None
    after = trail.after
    if after is not None and (after.overflow or after.recovered or after.clamped):
        overflow = after.overflow or ("recovered" if after.recovered else "clamped")
    # By position, in the fields' order (see RequestReport): the common ones.
    return RequestReport(
        trail.request_id, trail.at, chat.route, chat.model, agent, chat.stream,
        499 if trail.client_gone else trail.status, trail.verdict,
        time.perf_counter() - trail.started if seconds is None else seconds,
        trail.proxy_seconds,
        session_id, method, named_session,
        floor_kind, floor_reason, restored, carried, carried_from, added_tokens, capped,
        overflow, _attempts(trail) if trail.stream is not None else trail.attempts,
        trail.usage, trail.finish_reason, trail.response_model,
        window, trail.client_traceparent,
        trail.trace.trace_id if trail.trace is not None else None, **fields)


def _attempts(trail: TrailFacts) -> tuple[Attempt, ...]:
    attempts = trail.attempts  # a tuple already (the trail's and the inspector's)
    stream = trail.stream
    if not attempts or stream is None:
        return attempts
    broke = stream.broke
    if stream.first_chunk_at is not None or broke is not None:
        last = attempts[-1]
        attempts = (*attempts[:-1], last._replace(
            first_chunk=last.first_chunk if stream.first_chunk_at is None
            else stream.first_chunk_at - trail.started, broke=broke))
    return attempts

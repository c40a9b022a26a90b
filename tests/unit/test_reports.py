"""``report_of``: every field of the report where a trail says it, as the report's own
constructor would place it by name (report_of passes them by position, in one call)."""

from __future__ import annotations

from types import SimpleNamespace as Ns
from typing import Any

import pytest

from proxy.errors import UpstreamTimeout, UpstreamUnavailable
from proxy.report import Attempt, RequestReport, SummaryMade
from proxy.server.relay import StreamOutcome
from proxy.server.reports import report_of
from proxy.wire.usage import Usage

USAGE = Usage(100, 20, 120, 30, 5)
ATTEMPTS = (Attempt(0, 400, 0.1, 0.2, error="overflow", traceparent="t0"),
            Attempt(1, 200, 0.5, 0.3, compacted=True, traceparent="t1"))


def trail(**changes: Any) -> Ns:
    chat = Ns(route="messages", model="claude-x", stream=True, agent_id="from-chat",
              body={"messages": [{"role": "user", "content": "client's"}]})
    values: dict[str, Any] = dict(
        request_id="req-1", at=1_700_000_000.5, started=50.0, chat=chat, ctx=None,
        decision=None, outgoing=None, steps=(), attempts=ATTEMPTS, stream=None, usage=USAGE,
        finish_reason="stop", response_model="claude-x-2026", after=None,
        proxy_seconds=0.012, status=200, client_gone=False, client_traceparent=None,
        trace=None, verdict="the verdict")
    values.update(changes)
    return Ns(**values)


def test_a_bare_trail_is_a_report_of_its_own_fields_and_the_defaults() -> None:
    made = report_of(trail(), 2.5)  # type: ignore[arg-type]
    assert made == RequestReport(
        request_id="req-1", at=1_700_000_000.5, route="messages", model="claude-x",
        agent="from-chat", stream=True, status=200, verdict="the verdict", seconds=2.5,
        proxy_seconds=0.012, attempts=ATTEMPTS, usage=USAGE, finish_reason="stop",
        response_model="claude-x-2026")
    assert made.floor_kind == "none" and made.body is None and made.summary is None


def test_every_field_a_full_trail_sets_lands_where_its_name_says() -> None:
    ctx = Ns(signals=Ns(session_id="named-1", session_source="header", agent_id="pi"),
             lineage=Ns(session_id="s-lineage", method="header"), window=128_000)
    decision = Ns(verdict="floor; session=s1; reason=restored_raw", kind="floor",
                  added_raw=12, added_tokens=4000, capped=True, session_id="s-decision",
                  source_session=None)
    summary = Ns(model="summarizer", seconds=0.4, began=50.25, prompt_tokens=900,
                 completion_tokens=90, failure=None, traceparent="t-summary")
    compaction = Ns(label="compacted:overflow", why="overflow", replaced=7,
                    tokens_removed=9000, window=64_000, summary=summary)
    sent = ({"role": "user", "content": "sent"},)
    outgoing = Ns(body=b"{sent}", origins=("agent",), messages=sent, compaction=compaction,
                  clamp=Ns(requested=8192, limit=4096))
    full = trail(ctx=ctx, decision=decision, outgoing=outgoing,
                 steps=(Ns(overflow=None), Ns(overflow="recovered"), Ns(overflow=None)),
                 stream=StreamOutcome(first_chunk_at=50.9), client_gone=True, status=200,
                 client_traceparent="00-client", trace=Ns(trace_id="ab" * 16))
    expected = dict(
        request_id="req-1", at=1_700_000_000.5, route="messages", model="claude-x",
        agent="pi", stream=True, status=499, verdict="the verdict", seconds=3.0,
        proxy_seconds=0.012, session_id="s-lineage", method="header",
        named_session="named-1", floor_kind="floor", floor_reason="restored_raw",
        restored=12, carried=0, carried_from=None, added_tokens=4000, capped=True,
        overflow="recovered",
        # The last attempt's first chunk, from the request's start.
        attempts=(ATTEMPTS[0], ATTEMPTS[1]._replace(first_chunk=50.9 - 50.0)),
        usage=USAGE, finish_reason="stop", response_model="claude-x-2026", window=64_000,
        traceparent="00-client", trace_id="ab" * 16, compaction="compacted:overflow",
        compaction_why="overflow", replaced=7, tokens_removed=9000,
        summary=SummaryMade("summarizer", 0.25, 0.4, 900, 90, None, "t-summary"),
        clamp=(8192, 4096), body=b"{sent}", messages=sent, origins=("agent",))
    assert report_of(full, 3.0) == RequestReport(**expected)  # type: ignore[arg-type]
    # Without content: the same but what was sent.
    assert report_of(full, 3.0, content=False) == RequestReport(  # type: ignore[arg-type]
        **{**expected, "body": None, "messages": None, "origins": None})


def test_a_carry_and_an_overflow_seen_after_the_answer() -> None:
    decision = Ns(verdict="carry; from=old", kind="carry", added_raw=3, added_tokens=700,
                  capped=False, session_id="s-new", source_session="s-old")
    made = report_of(trail(  # type: ignore[arg-type]
        decision=decision, after=Ns(overflow=None, recovered=False, clamped=True),
        outgoing=Ns(body=b"b", origins=None, messages=None, compaction=None, clamp=None)),
        1.0)
    assert (made.floor_kind, made.carried, made.carried_from, made.added_tokens,
            made.restored, made.floor_reason, made.session_id, made.overflow) == (
        "carry", 3, "s-old", 700, 0, None, "s-new", "clamped")
    # The client's messages, when tailfloor sent them as they came.
    assert made.messages == [{"role": "user", "content": "client's"}] and made.body == b"b"


@pytest.mark.parametrize(("outcome", "broke"), [
    (StreamOutcome(first_chunk_at=50.9, upstream_error=UpstreamUnavailable("closed")),
     "mid_stream"),
    (StreamOutcome(first_chunk_at=50.9, upstream_error=UpstreamTimeout("silent")), "timeout"),
    (StreamOutcome(first_chunk_at=50.9, error_event=True), "error_event"),
    (StreamOutcome(upstream_error=UpstreamUnavailable("closed")), "mid_stream"),
])
def test_a_stream_that_broke_marks_the_last_attempt_only(outcome: StreamOutcome,
                                                         broke: str) -> None:
    made = report_of(trail(stream=outcome), 1.0)  # type: ignore[arg-type]
    first, last = made.attempts
    assert first == ATTEMPTS[0]
    assert (last.broke, last.error) == (broke, None)
    assert last.first_chunk == (None if outcome.first_chunk_at is None else 50.9 - 50.0)
    assert last._replace(broke=None, first_chunk=None) == ATTEMPTS[1]

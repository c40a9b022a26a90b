"""The spans a report becomes, and the trace context the request path sends upstream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.metrics import BoundedLabel
from proxy.report import Attempt, RequestReport, SummaryMade
from proxy.telemetry.attributes import SpanPlan, Upstream, plan_spans
from proxy.telemetry.tracecontext import TraceContext, ids_of, new_span_id, parse_traceparent
from proxy.wire.usage import Usage

UPSTREAM = Upstream.of("https://api.openai.com/v1")
FIXTURES = Path(__file__).parent.parent / "fixtures"


def report(**changes: object) -> RequestReport:
    values: dict[str, object] = dict(
        request_id="r", at=1000.0, route="chat_completions", model="gpt-x", agent="pi",
        stream=False, status=200, verdict="floor; session=s1", seconds=2.0,
        proxy_seconds=0.01, attempts=(Attempt(0, 200, 0.01, 0.5),),
        usage=Usage(20, 5, 25, 4), finish_reason="stop")
    values.update(changes)
    return RequestReport(**values)  # type: ignore[arg-type]


def plan(r: RequestReport, label: BoundedLabel | None = None) -> list[SpanPlan]:
    labels = label or BoundedLabel(8)
    return plan_spans(r, UPSTREAM, labels, BoundedLabel(8), lambda tp: ids_of(tp)[1])


def test_the_conversation_id_is_the_agents_own_name_only() -> None:
    _, attempt = plan(report(session_id="derived-lineage-id"))
    assert "gen_ai.conversation.id" not in attempt.attributes
    _, attempt = plan(report(session_id="x", named_session="agent-said-this"))
    assert attempt.attributes["gen_ai.conversation.id"] == "agent-said-this"
    for uuid in ("0d9b1c1e-6f0a-4d7e-9a55-3c2f1e8b7a10", "agent:main:main",
                 "abcdefghijklmnopqrstuvw"):  # 23 letters: a name, not yet a key's run
        server, attempt = plan(report(named_session=uuid))
        assert server.attributes["gen_ai.conversation.id"] == uuid
        assert attempt.attributes["gen_ai.conversation.id"] == uuid


def real_session_ids() -> set[str]:
    """The ids Pi (its session_id header, prompt_cache_key) and OpenClaw (its session keys)
    really sent, as recorded in the fixtures."""
    found: set[str] = set()
    for path in FIXTURES.glob("dialects/openai-responses/*/requests.json"):
        for request in json.loads(path.read_text()):
            headers = {k.lower(): v for k, v in request["headers"].items()}
            found.update(v for k, v in headers.items() if k in ("session_id", "session-id"))
            if isinstance(request["body"], dict) and "prompt_cache_key" in request["body"]:
                found.add(request["body"]["prompt_cache_key"])
    sessions = FIXTURES / "transcripts/captures/oc735-01-gateway/state/agents/main/sessions"
    found.update(json.loads((sessions / "sessions.json").read_text()))
    return found


def test_real_agents_session_ids_pass() -> None:
    ids = real_session_ids()
    assert any(i.startswith("agent:main:") for i in ids)  # OpenClaw's
    assert sum(len(i) == 36 and i.count("-") == 4 for i in ids) >= 4  # Pi's UUIDs
    for claimed in ids:
        server, attempt = plan(report(named_session=claimed))
        assert server.attributes["gen_ai.conversation.id"] == claimed
        assert attempt.attributes["gen_ai.conversation.id"] == claimed


@pytest.mark.parametrize("claimed", [
    "sk-proj-" + "A1b2C3d4" * 6,  # a key pasted into a session header
    "0d9b1c1e6f0a4d7e9a553c2f1e8b7a10",  # 32 hex digits, no known prefix
    "dGhpcyBpcyBhIHNlY3JldCB0b2tlbg==",  # base64
    "session:" + "Zq8xW2v" * 4,  # a token after a plain prefix
    "abcdefghijklmnopqrstuvwx",  # 24 letters: the shortest run refused
    "line\nfeed", "<script>alert(1)</script>", "x" * 129, " leading-space", "ünïcode",
])
def test_a_claimed_session_id_that_is_not_a_plain_id_is_left_out(claimed: str) -> None:
    server, attempt = plan(report(named_session=claimed))
    assert "gen_ai.conversation.id" not in server.attributes
    assert "gen_ai.conversation.id" not in attempt.attributes


def test_attempts_times_usage_provider_and_an_unvetted_model() -> None:
    sent = TraceContext.new().traceparent(new_span_id())
    r = report(attempts=(Attempt(0, 400, 0.01, 0.2, traceparent=sent),
                         Attempt(1, 200, 0.5, 0.3, compacted=True)),
               summary=SummaryMade("gpt-x", 0.25, 0.2, 100, 10))
    server, first, retry, summary = plan(r, BoundedLabel(8, vetted=True))
    assert first.span_id == ids_of(sent)[1]
    assert first.attributes["error.type"] == "400"
    assert first.end == pytest.approx(1000.21)
    assert retry.end == pytest.approx(1002.0)
    assert retry.attributes["gen_ai.conversation.compacted"] is True
    assert retry.attributes["gen_ai.usage.input_tokens"] == 20
    assert "gen_ai.usage.input_tokens" not in first.attributes
    # A model no upstream answered for is never a label: "other", as on /metrics.
    assert retry.name == "chat other"
    assert retry.attributes["gen_ai.provider.name"] == "openai"
    assert summary.attributes["tailfloor.summarizer"] is True
    assert summary.start == pytest.approx(1000.25)
    assert server.attributes["tailfloor.verdict"] == "floor"


def test_a_compacted_retry_whose_stream_broke_marks_the_retry_and_the_server() -> None:
    r = report(stream=True, usage=None, finish_reason=None,
               attempts=(Attempt(0, 400, 0.01, 0.2),
                         Attempt(1, 200, 0.5, 0.3, compacted=True, broke="timeout")))
    server, first, retry = plan(r)
    assert server.error == retry.error == "timeout"
    assert server.attributes["error.type"] == retry.attributes["error.type"] == "timeout"
    assert first.attributes["error.type"] == "400"  # the overflow, not the break
    assert retry.end == pytest.approx(1002.0)  # relayed until it broke: the request's end


def test_traceparent_parsing() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    parsed = parse_traceparent(good)
    assert parsed == TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
    assert parsed.traceparent("1111111111111111") == \
        "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
    for bad in (None, "", "00-zz", good.upper(), good + "-extra",
                "ff" + good[2:], "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01"):
        assert parse_traceparent(bad) is None, bad
    later = parse_traceparent("01" + good[2:] + "-more")  # a later version: its first fields
    assert later is not None and later.flags == "01"
    assert parse_traceparent(good[:-2] + "03").flags == "01"  # type: ignore[union-attr]

"""The encoded spans say what plan_spans says, for reports of every shape; the poster's
batches, queue bound and shutdown."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from proxy.metrics import BoundedLabel
from proxy.report import Attempt, RequestReport, SummaryMade
from proxy.telemetry import protowire as wire
from proxy.telemetry import spans as spans_module
from proxy.telemetry.attributes import Upstream, plan_spans
from proxy.telemetry.config import Sampler, telemetry_config
from proxy.telemetry.exporting import Endpoint, Episodes
from proxy.telemetry.poster import Poster
from proxy.telemetry.sampling import TraceSampler
from proxy.telemetry.spans import SpanEncoder
from proxy.telemetry.tracecontext import TraceContext, ids_of, new_span_id
from proxy.wire.usage import Usage
from tests.otlp_receiver import attributes
from tests.telemetry.socket_collector import SocketCollector

UPSTREAM = Upstream.of("https://api.anthropic.com")
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def report(**changes: object) -> RequestReport:
    trace = TraceContext(CLIENT_TRACE, None, "01")
    values: dict[str, object] = dict(
        request_id="r", at=1_700_000_000.25, route="messages", model="claude-x", agent="pi",
        stream=True, status=200, verdict="floor; session=s1", seconds=2.5,
        proxy_seconds=0.0123, attempts=(Attempt(
            0, 200, 0.01, 0.5, first_chunk=0.75,
            traceparent=trace.traceparent(new_span_id())),),
        usage=Usage(20_000, 5, 20_005, 4, 300), finish_reason="stop",
        response_model="claude-x-2026")
    values.update(changes)
    return RequestReport(**values)  # type: ignore[arg-type]


SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "floored": dict(floor_kind="floor", restored=12, added_tokens=4000, method="header",
                    named_session="agent-session", floor_reason="x"),
    "carried": dict(floor_kind="carry", carried=3, carried_from="old-session"),
    "client context": dict(traceparent=f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"),
    "failed": dict(status=502, attempts=(Attempt(0, None, 0.0, 0.1, error="connect",
                                                 traceparent=None),), usage=None),
    "overflow": dict(
        compaction="compacted:overflow", tokens_removed=9000, overflow="recovered",
        attempts=(Attempt(0, 400, 0.0, 0.2, traceparent=TraceContext(
                      CLIENT_TRACE, None, "01").traceparent(new_span_id())),
                  Attempt(1, 200, 0.6, 0.3, compacted=True, traceparent=TraceContext(
                      CLIENT_TRACE, None, "01").traceparent(new_span_id()))),
        summary=SummaryMade("claude-x", 0.25, 0.3, 100, 10, traceparent=TraceContext(
            CLIENT_TRACE, None, "01").traceparent(new_span_id()))),
    "summary failed": dict(summary=SummaryMade("claude-x", 0.2, 0.1, failure="timeout")),
    "no attempt": dict(status=400, attempts=(), usage=None, finish_reason=None),
    "broken stream": dict(attempts=(Attempt(0, 200, 0.01, 0.5, first_chunk=0.75,
                                            broke="mid_stream"),),
                          usage=None, finish_reason=None),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_encoded_spans_are_the_planned_ones(shape: str) -> None:
    r = report(**SHAPES[shape])
    labels, agents, answered = BoundedLabel(8), BoundedLabel(8), BoundedLabel(8)
    encoder = SpanEncoder(UPSTREAM, labels, agents, answered, TraceSampler(Sampler()))
    for _ in range(2):  # the second time from the fixed parts kept
        body = wire.export_traces(b"", wire.scope("t"), encoder.encode(
            r, labels(r.model), agents(r.agent or "none")))
        spans = ExportTraceServiceRequest.FromString(body).resource_spans[0] \
            .scope_spans[0].spans
        plans = plan_spans(r, UPSTREAM, labels, agents, lambda tp: ids_of(tp)[1],
                           response_label=answered)
        assert len(spans) == len(plans)
        server = spans[0]
        for span, plan in zip(spans, plans, strict=True):
            assert span.name == plan.name
            assert span.kind == (wire.SERVER if plan.kind == "server" else wire.CLIENT)
            assert attributes(span.attributes) == plan.attributes
            assert span.start_time_unix_nano == int(plan.start * 1e9)
            assert span.end_time_unix_nano == int(plan.end * 1e9)
            assert (span.status.code == 2) == (plan.error is not None)
            if plan.span_id is not None:
                assert int.from_bytes(span.span_id, "big") == plan.span_id
            if span is not server:
                assert span.parent_span_id == server.span_id
            assert span.trace_id == server.trace_id
            if r.traceparent or any(a.traceparent for a in r.attempts):
                assert span.trace_id.hex() == CLIENT_TRACE
        if r.traceparent:
            assert server.parent_span_id.hex() == "00f067aa0ba902b7"
            assert server.flags == 0x301
        else:
            assert not server.parent_span_id and server.flags == 0x101


@pytest.mark.parametrize("shape", ["plain", "floored", "carried", "failed", "broken stream",
                                   "small counts"])
def test_the_one_attempt_way_makes_the_same_bytes_as_the_general_way(
        shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    changes = SHAPES.get(shape, dict(stream=False, usage=Usage(11, 7, 18, 3, 2),
                                     attempts=(Attempt(0, 200, 0.01, 0.5),)))
    r = report(**changes)
    labels, agents, answered = BoundedLabel(8), BoundedLabel(8), BoundedLabel(8)
    encoder = SpanEncoder(UPSTREAM, labels, agents, answered, TraceSampler(Sampler()))
    # The ids each way draws, the same: then every byte is.
    monkeypatch.setattr(spans_module, "_getrandbits", lambda bits: 0x0123456789ABCDEF)
    monkeypatch.setattr(encoder._random, "getrandbits", lambda bits: 0x0123456789ABCDEF)
    model, agent = labels(r.model), agents(r.agent or "none")
    for _ in range(2):  # the second time from what each way kept
        fast = encoder.encode(r, model, agent)
        assert fast == encoder._general(r, model, agent)
        assert len(fast) == 2


def test_a_trace_the_sampler_drops_is_not_encoded() -> None:
    encoder = SpanEncoder(UPSTREAM, BoundedLabel(8), BoundedLabel(8), BoundedLabel(8),
                          TraceSampler(Sampler("parentbased_always_on")))
    unsampled = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-00"
    assert encoder.encode(report(traceparent=unsampled), "m", "a") == []
    assert len(encoder.encode(report(), "m", "a")) == 2


class FakeEndpoint:
    """Stands for a collector: records each body, answers ``ok``, after ``hold`` s."""

    shown = "http://collector:4318/v1/traces"

    def __init__(self, ok: bool = True, hold: float = 0.0) -> None:
        self.ok, self.hold = ok, hold
        self.bodies: list[bytes] = []
        self.posted = threading.Event()

    def post(self, body: bytes, timeout: float) -> bool:
        time.sleep(max(min(self.hold, timeout), 0.0))
        self.bodies.append(body)
        self.posted.set()
        return self.ok

    def close(self) -> None:
        pass

    def end(self) -> None:
        pass

    def batches(self) -> list[int]:
        return [len(ExportTraceServiceRequest.FromString(b).resource_spans[0]
                    .scope_spans[0].spans) for b in self.bodies]


def poster(endpoint: FakeEndpoint, dropped: list[tuple[str, int]], **env: str) -> Poster:
    config = telemetry_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **env})
    assert config is not None

    def batch_of(spans: Sequence[bytes]) -> bytes:
        return wire.export_traces(b"", wire.scope("t"), spans)

    def on_dropped(signal: str, count: int) -> None:
        dropped.append((signal, count))

    return Poster(config, endpoint, None,  # type: ignore[arg-type]
                  episodes=Episodes(on_dropped), batch_of=batch_of, on_dropped=on_dropped)


def spans(count: int) -> list[bytes]:
    fixed = wire.span_fixed("s", wire.SERVER, b"")
    return [wire.span(wire.span_prefix(bytes(16)), n.to_bytes(8, "big"), b"", fixed, 0, 1,
                      b"", wire.span_tail(False, 0x101)) for n in range(1, count + 1)]


def test_full_batches_go_at_once_and_the_rest_after_the_delay() -> None:
    endpoint, dropped = FakeEndpoint(), []
    sender = poster(endpoint, dropped, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="3",
                    OTEL_BSP_SCHEDULE_DELAY="60000")
    sender.add_spans(spans(7))
    assert endpoint.posted.wait(5)
    deadline = time.monotonic() + 5
    while endpoint.batches() != [3, 3] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert endpoint.batches() == [3, 3]  # the seventh waits for the delay...
    sender.shutdown()
    assert endpoint.batches() == [3, 3, 1]  # ...or the shutdown
    assert dropped == []


def test_the_queue_is_bounded_and_a_failed_batch_is_counted() -> None:
    endpoint, dropped = FakeEndpoint(ok=False, hold=0.5), []
    sender = poster(endpoint, dropped, OTEL_BSP_MAX_QUEUE_SIZE="4",
                    OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2", OTEL_BSP_SCHEDULE_DELAY="60000",
                    OTEL_EXPORTER_OTLP_TIMEOUT="200")
    sender.add_spans(spans(2))
    assert endpoint.posted.wait(5)
    sender.add_spans(spans(6))  # the collector holds the first batch: 4 fit, 2 do not
    assert ("traces", 2) in dropped
    sender.shutdown()
    assert sum(n for signal, n in dropped if signal == "traces") == 8  # every span
    assert all(size <= 2 for size in endpoint.batches())


def test_shutdown_is_bounded_by_the_exporter_timeout() -> None:
    endpoint, dropped = FakeEndpoint(hold=10.0), []
    sender = poster(endpoint, dropped, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="1",
                    OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_EXPORTER_OTLP_TIMEOUT="300")
    sender.add_spans(spans(20))
    began = time.monotonic()
    sender.shutdown()
    assert time.monotonic() - began < 2.0


def test_a_post_http_client_refuses_is_a_failed_export_not_an_exception() -> None:
    # A path with a space and a header value with a line break: http.client raises
    # ValueError (InvalidURL, "Invalid header value"), which must not end the poster thread.
    for url, headers in (("http://127.0.0.1:9/v1/tr aces", {}),
                         ("http://127.0.0.1:9/v1/traces", {"x-key": "a\r\nb"})):
        endpoint = Endpoint(url, headers)
        assert endpoint.post(b"\x0a\x00", timeout=1.0) is False


class DribblingCollector(SocketCollector):
    """Takes a request, then answers one byte every 0.1 s: each read waits less than any
    timeout, so only a bound on the whole post ends it."""

    def answer(self, client: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10_000:
            if self.stopped(0.1):
                return
            client.sendall(bytes([byte]))


def test_a_collector_dribbling_its_answer_holds_neither_a_post_nor_the_shutdown() -> None:
    collector = DribblingCollector()
    try:
        endpoint = Endpoint(collector.url, {})
        began = time.monotonic()
        assert endpoint.post(b"\x0a\x00", timeout=0.5) is False
        assert time.monotonic() - began < 1.5
        dropped: list[tuple[str, int]] = []
        sender = poster(endpoint, dropped, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="1",  # type: ignore[arg-type]
                        OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_EXPORTER_OTLP_TIMEOUT="500")
        sender.add_spans(spans(3))
        assert collector.accepted.wait(5)
        time.sleep(0.2)  # the first post is under way, reading the dribble
        began = time.monotonic()
        sender.shutdown()
        assert time.monotonic() - began < 2.0
        assert sum(n for signal, n in dropped if signal == "traces") == 3
    finally:
        collector.close()


def test_captured_messages_waiting_are_bounded_by_what_they_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from proxy.metrics import Metrics
    from proxy.policy.prices import PriceList
    from proxy.telemetry import sink as sink_module
    messages = ({"role": "user", "content": "hi"},)
    # What the messages hold, object by object: one such report fits, two do not.
    held = sum(map(sys.getsizeof, (messages, messages[0], "role", "user", "content", "hi")))
    monkeypatch.setattr(sink_module, "_CONTENT_HELD", held * 3 // 2)
    config = telemetry_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                               "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    assert config is not None
    metrics = Metrics()
    sink = sink_module.TelemetrySink(config, metrics, "http://127.0.0.1:9",
                                     lambda: PriceList(()))
    try:
        # A body far smaller than what its parsed messages hold.
        with_content = report(body=b"x" * 8, messages=messages)
        first = sink._content_of(with_content)
        second = sink._content_of(with_content)  # twice what the bound allows: left out
        assert first.messages is not None and first.body is None
        assert second.messages is None
        assert metrics.otlp_dropped.labels(signal="content")._value.get() == 1
        sink._release(first)  # the telemetry thread is done with the first
        assert sink._content_of(with_content).messages is not None
    finally:
        sink.shutdown()


def test_a_request_that_cannot_be_described_is_logged_once_per_episode(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from proxy.metrics import Metrics
    from proxy.policy.prices import PriceList
    from proxy.telemetry import sink as sink_module
    real = SpanEncoder.encode

    def encode(self: SpanEncoder, r: RequestReport, model: str, agent: str) -> list[bytes]:
        if r.request_id.startswith("bad"):
            raise RuntimeError("a bug describing " + r.request_id)
        return real(self, r, model, agent)

    monkeypatch.setattr(SpanEncoder, "encode", encode)
    caplog.set_level(logging.INFO, "tailfloor.telemetry")
    config = telemetry_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                               "OTEL_METRICS_EXPORTER": "none"})
    assert config is not None
    sink = sink_module.TelemetrySink(config, Metrics(), "http://127.0.0.1:9",
                                     lambda: PriceList(()))
    # Two episodes of failures, each ended by a request described.
    for request_id in ("bad-1", "bad-2", "good-1", "bad-3", "bad-4", "bad-5", "good-2"):
        sink.keep(report(request_id=request_id))
    sink.shutdown()  # describes what is queued, in order
    lines = [r for r in caplog.records if r.name == "tailfloor.telemetry"]
    failed = [r for r in lines if "could not describe" in r.getMessage()]
    again = [r for r in lines if "describes requests again" in r.getMessage()]
    assert [str(r.exc_info[1]) for r in failed if r.exc_info] == [
        "a bug describing bad-1", "a bug describing bad-3"]
    assert len(again) == 2

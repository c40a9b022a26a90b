"""The export's byte bounds: spans waiting in the poster, one export request's body, and
the captured content waiting for the telemetry thread. Oracles: a real receiver's bodies and
decoded spans, spans made here and counted here, and tracemalloc's count of what parsing
allocates."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from proxy.metrics import Metrics
from proxy.policy.prices import PriceList
from proxy.report import Attempt, RequestReport
from proxy.telemetry import poster as poster_module
from proxy.telemetry import protowire as wire
from proxy.telemetry import sink as sink_module
from proxy.telemetry.config import TelemetryConfig
from proxy.telemetry.content import held_bytes
from proxy.telemetry.exporting import Endpoint, Episodes
from proxy.telemetry.poster import Poster
from proxy.telemetry.sink import TelemetrySink
from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy
from tests.otlp_receiver import OtlpReceiver
from tests.telemetry.test_otlp_export import otel_env, post

KIB = 1024
RESOURCE = wire.resource((("service.name", "bounds-test"),))
SCOPE = wire.scope("tailfloor", "0")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    found = OtlpReceiver()
    yield found
    found.stop()


class Dropped:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, signal: str, count: int) -> None:
        with self._lock:
            self.counts[signal] = self.counts.get(signal, 0) + count

    def traces(self) -> int:
        with self._lock:
            return self.counts.get("traces", 0)


def made_span(number: int, filler: int) -> bytes:
    """A span named ``s<number>`` carrying ``filler`` bytes of one attribute."""
    return wire.span(wire.span_prefix((number + 1).to_bytes(16, "big")),
                     (number + 1).to_bytes(8, "big"), b"",
                     wire.span_fixed(f"s{number}", wire.CLIENT, b""), 1, 2,
                     wire.span_attribute("filler", "x" * filler),
                     wire.span_tail(False, wire.FLAG_SAMPLED))


def poster_to(receiver: OtlpReceiver, dropped: Dropped, *, delay: float, **bounds: int
              ) -> Poster:
    config = TelemetryConfig(traces_endpoint=receiver.url + "/v1/traces",
                             metrics_endpoint=None, schedule_delay=delay, timeout=5.0)
    return Poster(config, Endpoint(config.traces_endpoint or "", {}), None,
                  episodes=Episodes(dropped), on_dropped=dropped,
                  batch_of=lambda spans: wire.export_traces(RESOURCE, SCOPE, spans), **bounds)


def names(receiver: OtlpReceiver) -> list[str]:
    return [span.name for span in receiver.spans()]


def test_a_request_never_carries_more_than_its_limit_and_a_span_past_it_is_dropped(
        receiver: OtlpReceiver) -> None:
    dropped = Dropped()
    limit = 64 * KIB
    poster = poster_to(receiver, dropped, delay=0.05, request_bytes=limit)
    small = [made_span(n, 10 * KIB) for n in range(40)]
    big = [made_span(100 + n, limit) for n in range(2)]  # alone already past the limit
    try:
        poster.add_spans(small[:20] + big[:1])
        poster.add_spans(big[1:] + small[20:])
        receiver.wait(lambda: len(receiver.spans()) + dropped.traces() >= 42)
    finally:
        poster.shutdown()
    assert sorted(names(receiver)) == sorted(f"s{n}" for n in range(40))
    assert dropped.traces() == 2
    # 400 KiB of spans cannot go in fewer than seven requests of 64 KiB
    assert len(receiver.sizes) >= 7
    assert max(receiver.sizes) <= limit


def test_the_spans_queued_are_bounded_in_bytes(receiver: OtlpReceiver) -> None:
    dropped = Dropped()
    bound = 100 * KIB
    # A long delay: nothing is sent before the shutdown, so the queue only fills.
    poster = poster_to(receiver, dropped, delay=60.0, queue_bytes=bound)
    spans = [made_span(n, 10 * KIB) for n in range(30)]
    for start in range(0, 30, 5):
        poster.add_spans(spans[start:start + 5])
    poster.shutdown()  # sends what was queued
    fit, total = 0, 0
    for span in spans:  # the spans that fit, in order: each is the same size
        if total + len(span) > bound:
            break
        fit, total = fit + 1, total + len(span)
    assert 5 <= fit < 30
    assert names(receiver) == [f"s{n}" for n in range(fit)]
    assert dropped.traces() == 30 - fit
    assert sum(receiver.sizes) <= bound + 1024  # the spans, and one request's framing


def test_captured_content_splits_batches_at_a_real_receiver(
        clean_fake: FakeUpstream, receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 64 * KIB
    monkeypatch.setattr(poster_module, "REQUEST_BYTES", limit)
    env = otel_env(receiver, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
                   OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT="200000", OTEL_BSP_SCHEDULE_DELAY="100")
    proxy = InProcessProxy(clean_fake, env=env)
    made = 0
    try:
        for n in range(8):
            text = f"canary-{n}-" + "words and more " * 1400  # about 21 KB
            post(proxy, "/v1/chat/completions", {
                "model": "fake-model", "messages": [{"role": "user", "content": text}]})
            made += 2  # a server span and one attempt's
        huge = "huge-canary " + "z" * 100_000  # its attempt's span alone is past the limit
        post(proxy, "/v1/chat/completions", {
            "model": "fake-model", "messages": [{"role": "user", "content": huge}]})
        made += 2

        def dropped() -> float:
            return proxy.sample("tailfloor_otlp_dropped_total", settled=False,
                                signal="traces")

        receiver.wait(lambda: len(receiver.spans()) + dropped() >= made)
        time.sleep(0.3)  # nothing more comes
        assert len(receiver.spans()) + dropped() == made
        assert dropped() == 1
        assert max(receiver.sizes) <= limit
        raw = b"".join(receiver.raw)
        assert all(f"canary-{n}-".encode() in raw for n in range(8))
        assert b"huge-canary" not in raw
    finally:
        proxy.stop()


@pytest.mark.parametrize("body", [
    orjson.dumps([{"role": "user", "content": "long text " * 20_000}]),
    orjson.dumps([{"type": "text", "text": "ab"}] * 5000),  # many small objects
    orjson.dumps([{"role": "user", "content": "\U0001f600" + "a" * 50_000}]),  # 4 bytes a char
    orjson.dumps([[1, 2.5, None, True, "x"]] * 3000),
])
def test_held_bytes_is_never_less_than_what_parsing_allocated(body: bytes) -> None:
    parsed, allocated = parsed_and_allocated(body)
    weight = held_bytes(parsed, 1 << 40, objects=1 << 30)
    assert weight is not None and weight >= allocated
    early = held_bytes(parsed, 1000, objects=1 << 30)
    assert early is not None and early > 1000  # stops early, past the bound
    if len(body) > 1000:  # a parsed body is never more than 32 times its bytes
        assert weight <= 32 * len(body)
    objects = 1 + sum(1 for _ in _walk(parsed))
    assert held_bytes(parsed, 1 << 40, objects=objects) == weight
    assert held_bytes(parsed, 1 << 40, objects=objects - 1) is None  # too many to weigh


def parsed_and_allocated(body: bytes) -> tuple[Any, int]:
    """``body`` parsed, and the bytes parsing it allocated (tracemalloc's count)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parsed = orjson.loads(body)
        return parsed, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _walk(value: Any) -> Any:
    """Every object inside parsed JSON, the test's own count."""
    items = list(value.items()) if isinstance(value, dict) else value \
        if isinstance(value, list) else []
    for item in items:
        if isinstance(value, dict):
            yield from item  # the key and the value
            yield from _walk(item[1])
        else:
            yield item
            yield from _walk(item)


def test_the_content_bound_weighs_the_parsed_messages_not_the_body(
        receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    bound = 1024 * KIB
    monkeypatch.setattr(sink_module, "_CONTENT_HELD", bound)
    body = orjson.dumps([{"type": "text", "text": "ab"}] * 2000)  # 54 KB as bytes
    messages, allocated = parsed_and_allocated(body)
    # Held, these messages weigh over half the bound, though their body is a twentieth.
    assert allocated > bound // 2 and len(body) * 10 < bound
    config = TelemetryConfig(traces_endpoint=receiver.url + "/v1/traces",
                             metrics_endpoint=None, capture_content=True, schedule_delay=5.0)
    metrics = Metrics()

    def prices() -> PriceList:
        raise AssertionError("no metrics are exported here")

    sink = TelemetrySink(config, metrics, "http://127.0.0.1:9", prices)
    kept = 12
    try:
        for n in range(kept):  # well within the thread's first look (half a second)
            sink.keep(report(f"r{n}", body, messages))
    finally:
        sink.shutdown()
    content_dropped = metrics.otlp_dropped.labels(signal="content")._value.get()
    # Twelve bodies of 54 KB fit a 1 MiB bound; twelve parsed copies do not.
    assert content_dropped >= kept // 2
    with_content = [span for span in receiver.spans() if any(
        a.key == "gen_ai.input.messages" for a in span.attributes)]
    assert len(with_content) == kept - content_dropped


def report(request_id: str, body: bytes, messages: Any) -> RequestReport:
    return RequestReport(
        request_id=request_id, at=time.time(), route="chat_completions", model="m",
        agent=None, stream=False, status=200, verdict="none", seconds=0.1,
        proxy_seconds=0.01, attempts=(Attempt(0, 200, 0.01, 0.05),), body=body,
        messages=messages)

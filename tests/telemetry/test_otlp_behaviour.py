"""The export's behaviour against the real receiver: the answer's model, sampling as the
upstream is told it, a collector that recovers, deltas, and the flush on shutdown."""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Iterator

import orjson
import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy
from tests.otlp_receiver import OtlpReceiver, attributes
from tests.telemetry.test_otlp_export import (
    CANARY_HEADER,
    CLIENT,
    SERVER,
    TRACE_ID,
    chat,
    otel_env,
    post,
    spans_of,
)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    found = OtlpReceiver()
    yield found
    found.stop()


def answer(model: str) -> Reply:
    return Reply(raw_body=orjson.dumps({
        "id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}))


def test_the_response_model_is_the_answers_own_vetted(clean_fake: FakeUpstream,
                                                      receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        clean_fake.script.append(answer("fake-model-2026-05-01"))
        post(proxy, "/v1/chat/completions", chat())
        clean_fake.script.append(answer("sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"))
        post(proxy, "/v1/chat/completions", chat())
        post(proxy, "/v1/chat/completions", chat(stream=True))  # the fake's own: its model
        found = [attributes(s.attributes) for s in spans_of(receiver, 6) if s.kind == CLIENT]
        models = sorted(seen["gen_ai.response.model"] for seen in found)
        # A key-like name never goes out: "other", as the Prometheus model label would be.
        assert models == ["fake-model", "fake-model-2026-05-01", "other"]
        assert {seen["gen_ai.request.model"] for seen in found} == {"fake-model"}
        assert b"sk-proj-abcdefghijklmnopqrstuvwxyz" not in b"".join(receiver.raw)
    finally:
        proxy.stop()


def test_always_off_tells_the_upstream_and_exports_only_metrics(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver, OTEL_TRACES_SAMPLER="always_off"))
    try:
        post(proxy, "/v1/chat/completions", chat(),
             {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
        sent = clean_fake.chat_requests()[-1].headers["traceparent"]
        assert sent.startswith(f"00-{TRACE_ID}-") and sent.endswith("-00")
        receiver.wait(lambda: receiver.total("tailfloor.floors") == 1)
        time.sleep(0.5)
        assert receiver.spans() == []
    finally:
        proxy.stop()


def test_parentbased_ratio_follows_the_clients_flag(clean_fake: FakeUpstream,
                                                   receiver: OtlpReceiver) -> None:
    env = otel_env(receiver, OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                   OTEL_TRACES_SAMPLER_ARG="0")
    proxy = InProcessProxy(clean_fake, env=env)
    try:
        post(proxy, "/v1/chat/completions", chat(),
             {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
        post(proxy, "/v1/chat/completions", chat())  # a root: ratio 0, not recorded
        assert clean_fake.chat_requests()[-1].headers["traceparent"].endswith("-00")
        found = spans_of(receiver, 2)
        time.sleep(0.5)
        assert len(receiver.spans()) == 2
        assert {s.trace_id.hex() for s in found} == {TRACE_ID}
    finally:
        proxy.stop()


def test_a_collector_answering_503_then_back_is_one_warning_then_one_info(
        clean_fake: FakeUpstream, receiver: OtlpReceiver,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "tailfloor.telemetry")
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        receiver.mode, receiver.delay = "slow_503", 0.3
        for _ in range(3):
            began = time.monotonic()
            assert post(proxy, "/v1/chat/completions", chat())[0] == 200
            assert time.monotonic() - began < 1.0
        receiver.wait(lambda: proxy.sample("tailfloor_otlp_dropped_total",
                                           signal="traces") >= 2)
        receiver.mode = "ok"
        post(proxy, "/v1/chat/completions", chat())
        spans_of(receiver, 2)

        def lines(level: str) -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "tailfloor.telemetry"
                    and r.levelname == level and "export of traces" in r.getMessage()]

        receiver.wait(lambda: lines("INFO"))
        assert len(lines("WARNING")) == 1 and len(lines("INFO")) == 1
        assert receiver.url.removeprefix("http://") in lines("WARNING")[0]
        assert not any(CANARY_HEADER in line for line in lines("WARNING") + lines("INFO"))
    finally:
        proxy.stop()


def test_delta_temporality_and_the_flush_on_shutdown(clean_fake: FakeUpstream,
                                                     receiver: OtlpReceiver) -> None:
    env = otel_env(receiver, OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",
                   OTEL_METRIC_EXPORT_INTERVAL="60000", OTEL_BSP_SCHEDULE_DELAY="60000")
    proxy = InProcessProxy(clean_fake, env=env)
    try:
        for _ in range(3):
            post(proxy, "/v1/chat/completions", chat())
        time.sleep(0.7)
        assert receiver.spans() == [] and receiver.metrics == []  # nothing due yet
    finally:
        proxy.stop()  # ...until the shutdown sends it all
    found = receiver.spans()
    assert len(found) == 6 and sum(s.kind == SERVER for s in found) == 3
    (request,) = receiver.metrics
    sums = {m.name: m.sum for r in request.resource_metrics for s in r.scope_metrics
            for m in s.metrics if m.WhichOneof("data") == "sum"}
    floors = sums["tailfloor.floors"]
    assert floors.aggregation_temporality == \
        AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    assert sum(p.as_int for p in floors.data_points) == 3
    assert sum(p.as_int for p in sums[
        "gen_ai.client.inference.usage.input_tokens"].data_points) == 33


def leave_after(proxy: InProcessProxy, seconds: float) -> None:
    """A chat request whose client gives up after ``seconds``."""
    with pytest.raises(TimeoutError):
        urllib.request.urlopen(urllib.request.Request(
            proxy.url + "/v1/chat/completions", data=orjson.dumps(chat()),
            headers={"Content-Type": "application/json"}), timeout=seconds)


def test_a_client_gone_mid_attempt_leaves_its_span_in_the_trace_the_upstream_was_told(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    clean_fake.script.append(Reply(delay_before_headers=2.0))
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        leave_after(proxy, 0.5)  # the client gives up before the upstream answers
        told = clean_fake.chat_requests()[-1].headers["traceparent"]
        server = spans_of(receiver, 1)[0]
        assert server.kind == SERVER
        assert server.trace_id.hex() == told.split("-")[1]
        assert attributes(server.attributes)["http.response.status_code"] == 499
    finally:
        proxy.stop()


def test_a_client_that_leaves_mid_attempt_still_has_the_attempts_span(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        clean_fake.script.append(Reply(delay_before_headers=3.0))
        leave_after(proxy, 0.8)
        found = spans_of(receiver, 2)
        [server] = [s for s in found if s.kind == SERVER]
        [attempt] = [s for s in found if s.kind == CLIENT]
        assert attributes(attempt.attributes)["error.type"] == "cancelled"
        assert attempt.parent_span_id == server.span_id
        # the span the upstream was told is its parent: the one exported
        sent = clean_fake.chat_requests()[-1].headers["traceparent"]
        assert sent.split("-")[1] == attempt.trace_id.hex()
        assert sent.split("-")[2] == attempt.span_id.hex()
    finally:
        proxy.stop()


def test_a_client_that_leaves_while_an_error_body_is_read_records_the_attempt_once(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    # The upstream's error head comes at once; its body a piece a second.
    clean_fake.script.append(Reply(status=500, chunks=[
        b'{"error": ', b'{"message": "slow failure", ', b'"type": "server_error"}}'],
        delay_between_chunks=1.0))
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        leave_after(proxy, 0.5)  # gone while the proxy reads the error body
        found = spans_of(receiver, 2)

        def durations() -> int:  # the attempts the duration histogram counted, in all
            points = receiver.points("gen_ai.client.inference.duration")
            return points and sum(point.count for point in points[-1:])

        receiver.wait(durations)
        time.sleep(1.0)  # anything recorded twice would be exported by now
        assert len(receiver.spans()) == 2
        [server] = [s for s in found if s.kind == SERVER]
        [attempt] = [s for s in receiver.spans() if s.kind == CLIENT]
        assert attempt.parent_span_id == server.span_id
        assert attributes(attempt.attributes)["error.type"] == "500"
        assert durations() == 1
        assert len(clean_fake.chat_requests()) == 1  # one attempt made, no retry
    finally:
        proxy.stop()

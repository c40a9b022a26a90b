"""Traces and metrics exported to a real OTLP/HTTP receiver, through tailfloor built
in-process in front of the fake upstream."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fake_behaviour import AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy
from tests.otlp_receiver import OtlpReceiver, attributes
from tests.recovery.conversation import history, rules_dir

CANARY_KEY = "sk-canary-e1d2c3b4a5-secret"
CANARY_HEADER = "collector-token-canary-77aa"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
SERVER, CLIENT = 2, 3  # the protobuf's SpanKind values


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    found = OtlpReceiver()
    yield found
    found.stop()


def otel_env(receiver: OtlpReceiver, **more: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_HEADERS": f"x-collector-token={CANARY_HEADER}",
            "OTEL_METRIC_EXPORT_INTERVAL": "200", "OTEL_EXPORTER_OTLP_TIMEOUT": "2000",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "tailfloor-under-test", **more}


def post(proxy: InProcessProxy, path: str, body: dict[str, Any],
         headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(
        proxy.url + path, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {CANARY_KEY}",
                 "x-api-key": CANARY_KEY, **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read(), dict(response.headers)


def chat(stream: bool = False) -> dict[str, Any]:
    return {"model": "fake-model", "stream": stream,
            "messages": [{"role": "user", "content": "secret-content-canary hello"}]}


def spans_of(receiver: OtlpReceiver, count: int) -> list[Any]:
    return receiver.wait(lambda: (found := receiver.spans()) and len(found) >= count and found)


def test_a_chat_request_is_one_trace_joined_to_the_clients_and_the_upstreams(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        status, _, _ = post(proxy, "/v1/chat/completions", chat(),
                            {"traceparent": TRACEPARENT})
        assert status == 200
        server, attempt = sorted(spans_of(receiver, 2), key=lambda s: s.kind)
        assert server.kind == SERVER and attempt.kind == CLIENT
        assert server.trace_id.hex() == attempt.trace_id.hex() == TRACE_ID
        assert server.parent_span_id.hex() == CLIENT_SPAN
        assert attempt.parent_span_id == server.span_id
        # The upstream was told tailfloor's attempt span is its parent.
        sent = clean_fake.chat_requests()[-1].headers["traceparent"]
        assert sent == f"00-{TRACE_ID}-{attempt.span_id.hex()}-01"
        assert server.name == "POST /v1/chat/completions"
        assert attempt.name == "chat fake-model"
        seen = attributes(attempt.attributes)
        assert seen["gen_ai.operation.name"] == "chat"
        assert seen["gen_ai.provider.name"] == "openai"
        assert seen["gen_ai.request.model"] == "fake-model"
        assert seen["gen_ai.request.stream"] is False
        # What the fake reported: 11 prompt tokens (3 of them cached), 7 completion.
        assert seen["gen_ai.usage.input_tokens"] == 11
        assert seen["gen_ai.usage.output_tokens"] == 7
        assert seen["gen_ai.usage.cache_read.input_tokens"] == 3
        assert seen["gen_ai.response.finish_reasons"] == ("stop",)
        assert seen["gen_ai.response.model"] == "fake-model"  # the answer's own "model"
        assert seen["server.address"] == "127.0.0.1"
        assert "gen_ai.conversation.id" not in seen  # the agent named no session
        assert "gen_ai.conversation.compacted" not in seen
        on_server = attributes(server.attributes)
        assert on_server["http.response.status_code"] == 200
        assert on_server["tailfloor.floor.kind"] in ("none", "floor", "off")
        assert server.start_time_unix_nano <= attempt.start_time_unix_nano
        assert attempt.end_time_unix_nano <= server.end_time_unix_nano
        assert {"service.name": "tailfloor-under-test"}.items() <= receiver.resources()[0].items()
    finally:
        proxy.stop()


def test_stream_responses_and_messages_routes_and_token_counts_match_prometheus(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        status, raw, _ = post(proxy, "/v1/chat/completions", chat(stream=True))
        assert status == 200 and b"data: [DONE]" in raw
        post(proxy, "/v1/responses", {"model": "fake-model", "input": [
            {"role": "user", "content": "secret-content-canary"}]})
        post(proxy, "/v1/messages", {"model": "fake-model", "max_tokens": 64, "messages": [
            {"role": "user", "content": "secret-content-canary"}]},
            {"anthropic-version": "2023-06-01"})
        found = spans_of(receiver, 6)
        servers = {s.name: s for s in found if s.kind == SERVER}
        assert set(servers) == {"POST /v1/chat/completions", "POST /v1/responses",
                                "POST /v1/messages"}
        clients = {attributes(servers[name].attributes)["http.route"]:
                   attributes(next(c.attributes for c in found if c.kind == CLIENT
                                   and c.parent_span_id == servers[name].span_id))
                   for name in servers}
        streamed = clients["/v1/chat/completions"]
        assert streamed["gen_ai.request.stream"] is True
        assert streamed["gen_ai.response.time_to_first_chunk"] >= 0
        assert streamed["gen_ai.usage.input_tokens"] == 11
        assert clients["/v1/messages"]["gen_ai.provider.name"] == "anthropic"
        assert clients["/v1/responses"]["gen_ai.provider.name"] == "openai"
        for seen in clients.values():
            assert seen["gen_ai.usage.output_tokens"] == 7
        # No client traceparent: each request is its own trace, started by tailfloor, and
        # the upstream's traceparent names it.
        sent = {r.path: r.headers["traceparent"] for r in clean_fake.received
                if r.path.startswith("/v1/")}
        for server in servers.values():
            route = attributes(server.attributes)["http.route"]
            assert sent[route].split("-")[1] == server.trace_id.hex()
            assert not server.parent_span_id
        # The same tokens both ways: OTLP's input holds the cached ones too (semconv),
        # Prometheus splits them into input and cached_input.
        want_input = (proxy.sample("tailfloor_tokens_total", type="input")
                      + proxy.sample("tailfloor_tokens_total", type="cached_input"))
        assert want_input == 33
        receiver.wait(lambda: receiver.total(
            "gen_ai.client.inference.usage.input_tokens") == want_input)
        receiver.wait(lambda: receiver.total(
            "gen_ai.client.inference.usage.output_tokens")
            == proxy.sample("tailfloor_tokens_total", type="output") == 21)
        receiver.wait(lambda: receiver.total(
            "gen_ai.client.inference.usage.cache_read.input_tokens") == 9)
        point = receiver.points("gen_ai.client.inference.usage.input_tokens")[-1]
        assert attributes(point.attributes)["gen_ai.token.modality"] == "text"
        assert receiver.wait(lambda: receiver.points("gen_ai.client.inference.duration"))
        assert receiver.wait(lambda: receiver.points(
            "gen_ai.client.inference.time_to_first_chunk"))
        assert receiver.wait(lambda: receiver.points("tailfloor.floors"))
        proxy.stop()
        exported = b"".join(receiver.raw)
        assert CANARY_HEADER.encode() in exported  # the receiver did see every header...
        for secret in (CANARY_KEY, "secret-content-canary", "Bearer"):
            assert secret.encode() not in exported  # ...and never a key or a message
    finally:
        proxy.stop()


def test_a_malformed_traceparent_starts_a_new_trace(clean_fake: FakeUpstream,
                                                    receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        status, _, _ = post(proxy, "/v1/chat/completions", chat(),
                            {"traceparent": "00-zz-not-a-context", "tracestate": "a=b"})
        assert status == 200
        server = next(s for s in spans_of(receiver, 2) if s.kind == SERVER)
        assert not server.parent_span_id
        received = clean_fake.chat_requests()[-1].headers
        assert received["traceparent"].split("-")[1] == server.trace_id.hex()
        assert "tracestate" not in {name.lower() for name in received}
    finally:
        proxy.stop()


def test_without_an_endpoint_nothing_changes(clean_fake: FakeUpstream) -> None:
    proxy = InProcessProxy(clean_fake, env={"OTEL_SERVICE_NAME": "x"})
    try:
        assert proxy.state.record.sinks == [] and not proxy.state.traces
        post(proxy, "/v1/chat/completions", chat(), {"traceparent": TRACEPARENT})
        # The client's context goes upstream untouched, as any other header.
        assert clean_fake.chat_requests()[-1].headers["traceparent"] == TRACEPARENT
    finally:
        proxy.stop()


def test_a_collector_slow_then_down_never_slows_a_request(
        clean_fake: FakeUpstream, receiver: OtlpReceiver,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        post(proxy, "/v1/chat/completions", chat())
        spans_of(receiver, 2)
        receiver.mode, receiver.delay = "slow_503", 3.0
        posts = receiver.posts
        for _ in range(3):
            began = time.monotonic()
            assert post(proxy, "/v1/chat/completions", chat())[0] == 200
            # Far under the collector's 3 s hold: the export never sits on the request.
            assert time.monotonic() - began < 1.0
        receiver.wait(lambda: receiver.posts > posts)  # the export is being held meanwhile
        began = time.monotonic()
        assert post(proxy, "/v1/chat/completions", chat())[0] == 200
        assert time.monotonic() - began < 1.0
        receiver.stop()  # connection refused from now on
        for _ in range(3):
            began = time.monotonic()
            assert post(proxy, "/v1/chat/completions", chat())[0] == 200
            assert time.monotonic() - began < 1.0
        # The export threads say so (their own threads: caplog, not the proxy's log).
        receiver.wait(lambda: proxy.sample("tailfloor_otlp_dropped_total", signal="traces") >= 4)
        warned = [r.getMessage() for r in caplog.records if r.name == "tailfloor.telemetry"
                  and r.levelname == "WARNING" and "export of traces" in r.getMessage()]
        assert len(warned) == 1  # one failing episode, one line
        assert CANARY_HEADER not in warned[0]
    finally:
        proxy.stop()


def test_an_overflow_recovered_is_two_attempts_a_summarizer_call_and_compacted(
        clean_fake: FakeUpstream, receiver: OtlpReceiver, tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour(max_chars=9000)
    prices = '[[prices]]\nmodel = "fake-*"\ninput = 2\noutput = 8\ncache_read = 1\n'
    proxy = InProcessProxy(clean_fake, "--rules", str(rules_dir(tmp_path, models=prices)),
                           "--state", str(tmp_path / "state"), env=otel_env(receiver))
    try:
        messages = [*history("a", 8, 700), {"role": "user", "content": "what now?"}]
        status, _, headers = post(proxy, "/v1/chat/completions", {
            "model": "fake-model", "messages": messages, "max_completion_tokens": 256},
            {"traceparent": TRACEPARENT})
        assert status == 200 and headers["x-tailfloor"] == "compacted:overflow"
        found = spans_of(receiver, 4)
        assert {span.trace_id.hex() for span in found} == {TRACE_ID}
        server = next(s for s in found if s.kind == SERVER)
        on_server = attributes(server.attributes)
        assert on_server["tailfloor.compaction"] == "compacted:overflow"
        assert on_server["tailfloor.overflow"] == "recovered"
        assert on_server["tailfloor.compaction.tokens_removed"] > 0
        calls = [attributes(s.attributes) for s in found if s.kind == CLIENT]
        summarizer = [c for c in calls if c.get("tailfloor.summarizer")]
        attempts = sorted((c for c in calls if "tailfloor.retry" in c),
                          key=lambda c: c["tailfloor.retry"])
        assert len(summarizer) == 1 and len(attempts) == 2
        first, retry = attempts
        assert first["error.type"] == "400" and "gen_ai.conversation.compacted" not in first
        assert retry["gen_ai.conversation.compacted"] is True and "error.type" not in retry
        assert summarizer[0]["gen_ai.usage.input_tokens"] > 0
        # Each attempt told the upstream its own span; the summarizer's call is a child of
        # the request too.
        chats = [r for r in clean_fake.chat_requests() if not is_summarization(
            orjson.loads(r.body)["messages"])]
        span_ids = {s.span_id.hex() for s in found if s.kind == CLIENT}
        assert {r.headers["traceparent"].split("-")[2] for r in chats} <= span_ids
        assert len(chats) == 2
        assert all(s.parent_span_id == server.span_id for s in found if s.kind == CLIENT)
        # The summarizer's call names the summarizer's span as its parent, in the trace.
        (summarizing,) = [r for r in clean_fake.chat_requests() if is_summarization(
            orjson.loads(r.body)["messages"])]
        summary_span = next(s for s in found if s.kind == CLIENT
                            and attributes(s.attributes).get("tailfloor.summarizer"))
        assert summarizing.headers["traceparent"] == \
            f"00-{TRACE_ID}-{summary_span.span_id.hex()}-01"
        receiver.wait(lambda: receiver.total("tailfloor.overflows") == 1)
        receiver.wait(lambda: receiver.total("tailfloor.compactions") == 1)
        # Dollars: the summarizer's call and what compaction took out, priced by the row,
        # the same on /metrics and over OTLP.
        summary = proxy.sample("tailfloor_cost_usd_total", kind="summary")
        assert summary == pytest.approx((summarizer[0]["gen_ai.usage.input_tokens"] * 2
                                         + summarizer[0]["gen_ai.usage.output_tokens"] * 8)
                                        / 1e6)
        saved = proxy.sample("tailfloor_cost_usd_total", kind="saved")
        assert saved == pytest.approx(on_server["tailfloor.compaction.tokens_removed"] * 2 / 1e6)
        request = proxy.sample("tailfloor_cost_usd_total", kind="request", model="fake-model")
        assert request > 0
        total = summary + saved + request
        receiver.wait(lambda: receiver.total("tailfloor.cost") == pytest.approx(total))
        assert proxy.sample("tailfloor_cost_unpriced_total") == 0
        clean_fake.behaviour = None
        post(proxy, "/v1/chat/completions", {"model": "unpriced-model", "messages": [
            {"role": "user", "content": "hi"}]})
        assert proxy.sample("tailfloor_cost_unpriced_total", model="unpriced-model") == 1
    finally:
        proxy.stop()

"""Traces and metrics exported to a real OTLP/HTTP receiver, through tailfloor built
in-process in front of the fake upstream."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy
from tests.otlp_receiver import OtlpReceiver, attributes

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

"""A streamed answer that ends short of whole, as a real receiver gets its spans and metrics:
the upstream breaking off, going silent, or sending an error event. The oracle is what the
client itself read (the error event that ended its stream) and the receiver's protobuf."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy
from tests.otlp_receiver import OtlpReceiver, attributes
from tests.telemetry.test_otlp_export import CLIENT, SERVER, chat, otel_env, spans_of


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    found = OtlpReceiver()
    yield found
    found.stop()


def streamed(proxy: InProcessProxy, path: str, body: dict[str, Any],
             headers: dict[str, str] | None = None) -> list[bytes]:
    """The client's stream, event by event, read to its end."""
    request = urllib.request.Request(proxy.url + path, data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return [event for event in response.read().split(b"\n\n") if event.strip()]


def spans_by_kind(receiver: OtlpReceiver, count: int) -> tuple[Any, Any]:
    found = spans_of(receiver, count)
    [server] = [s for s in found if s.kind == SERVER]
    [client] = [s for s in found if s.kind == CLIENT]
    return server, client


def durations_by_error(receiver: OtlpReceiver) -> dict[str | None, int]:
    """Attempts the duration histogram counted, by their ``error.type``."""
    counts: dict[str | None, int] = {}
    for point in receiver.points("gen_ai.client.inference.duration"):
        kind = attributes(point.attributes).get("error.type")
        counts[kind] = counts.get(kind, 0) + point.count
    return counts


@pytest.mark.parametrize(("reply", "extra", "code"), [
    (Reply(close_after_chunks=2), (), "upstream_mid_stream"),
    (Reply(delay_between_chunks=1.0), ("--read-timeout", "0.4"), "upstream_timeout"),
], ids=["broken off", "gone silent"])
def test_a_stream_the_upstream_broke_is_an_error_on_both_spans_and_the_duration(
        clean_fake: FakeUpstream, receiver: OtlpReceiver, reply: Reply,
        extra: tuple[str, ...], code: str) -> None:
    proxy = InProcessProxy(clean_fake, *extra, env=otel_env(
        receiver, OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta"))
    try:
        clean_fake.script.append(reply)
        events = streamed(proxy, "/v1/chat/completions", chat(stream=True))
        ended = orjson.loads(events[-1].removeprefix(b"data: "))
        assert ended["error"]["code"] == code  # what the client read: the answer broke
        kind = code.removeprefix("upstream_")
        server, client = spans_by_kind(receiver, 2)
        for span in (server, client):
            assert span.status.code == Status.STATUS_CODE_ERROR
            assert attributes(span.attributes)["error.type"] == kind
        assert attributes(server.attributes)["http.response.status_code"] == 200
        assert attributes(client.attributes)["http.response.status_code"] == 200
        # The attempt lasted until the break, not only until its head.
        assert client.end_time_unix_nano >= server.end_time_unix_nano - 50_000_000
        assert receiver.wait(lambda: durations_by_error(receiver).get(kind)) == 1

        # A whole stream after it: no error anywhere (the control).
        before = len(receiver.spans())
        events = streamed(proxy, "/v1/chat/completions", chat(stream=True))
        assert events[-1] == b"data: [DONE]"
        whole = receiver.wait(lambda: (found := receiver.spans()[before:]) and
                              len(found) >= 2 and found)
        for span in whole:
            assert span.status.code == Status.STATUS_CODE_UNSET
            assert "error.type" not in attributes(span.attributes)
        assert receiver.wait(lambda: durations_by_error(receiver).get(None)) == 1
    finally:
        proxy.stop()


def test_an_error_event_the_upstream_sent_is_an_error_on_both_spans(
        clean_fake: FakeUpstream, receiver: OtlpReceiver) -> None:
    proxy = InProcessProxy(clean_fake, env=otel_env(receiver))
    try:
        clean_fake.script.append(Reply(stream_error={"message": "boom", "code": "server_error"}))
        events = streamed(proxy, "/v1/responses",
                          {"model": "fake-model", "input": "hi", "stream": True})
        assert b"response.failed" in events[-1]
        server, client = spans_by_kind(receiver, 2)
        for span in (server, client):
            assert span.status.code == Status.STATUS_CODE_ERROR
            assert attributes(span.attributes)["error.type"] == "error_event"
        assert attributes(server.attributes)["http.route"] == "/v1/responses"
    finally:
        proxy.stop()


def test_streams_cut_off_in_a_row_are_one_warning_however_often(
        clean_fake: FakeUpstream) -> None:
    """Each cut-off stream had its 200 head first: that ended the episode, so every one of
    them was logged again."""
    proxy = InProcessProxy(clean_fake)
    try:
        for _ in range(4):
            clean_fake.script.append(Reply(close_after_chunks=2))
            streamed(proxy, "/v1/chat/completions", chat(stream=True))
        clean_fake.script.append(Reply())
        streamed(proxy, "/v1/chat/completions", chat(stream=True))
        for _ in range(3):  # cut off again, soon after: counted, not logged
            clean_fake.script.append(Reply(close_after_chunks=2))
            streamed(proxy, "/v1/chat/completions", chat(stream=True))
        assert proxy.sample("tailfloor_upstream_errors_total", kind="mid_stream") == 7
        logged = [record for record in map(orjson.loads, proxy.logs().splitlines())
                  if record["logger"] == "tailfloor.upstream"]
        assert [(r["level"], r["msg"].split(": ", 1)[0]) for r in logged] == [
            ("warning", f"the upstream {clean_fake.url} failed (mid_stream)"),
            ("info", f"the upstream {clean_fake.url} answers again (3 more mid_stream "
                     "failures were only counted)")]
    finally:
        proxy.stop()

"""A plain answer too large to hold (over 8 MiB) passes through as it arrives; when the
upstream breaks it after its head, the client already has the 200: the failure is counted
as a stream broken mid-way (what the upstream error alert adds to the 5xx answers), not as
a connect failure or a timeout (which were 5xx answers already), the inspector says the
answer broke off and both spans a real OTLP receiver gets are errors. The oracle is what the
client read: a 200 and fewer bytes than the head promised."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.conftest import ProxyProcess
from tests.e2e.rawhttp import read_request, send_raw
from tests.inspector.client import fetch, session_json, session_url
from tests.otlp_receiver import OtlpReceiver, attributes
from tests.telemetry.test_otlp_broken_streams import receiver, spans_by_kind
from tests.telemetry.test_otlp_export import otel_env

__all__ = ["receiver"]  # the fixture, shared

PROMISED = 20 * 1024 * 1024
SENT = 10 * 1024 * 1024  # past the 8 MiB a plain answer is held up to


@pytest.fixture
def breaking_upstream() -> Iterator[str]:
    """Answers every request with a 200 whose JSON body stops at ``SENT`` of ``PROMISED``
    bytes, then closes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                read_request(connection)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: %d\r\n\r\n" % PROMISED)
                connection.sendall(b'{"id":"x","choices":[{"message":{"content":"'
                                   + b"y" * (SENT - 40))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    server.close()


def test_a_large_plain_answer_broken_after_its_head_is_mid_stream(
        breaking_upstream: str, receiver: OtlpReceiver) -> None:
    proxy = ProxyProcess(breaking_upstream, env=otel_env(receiver))
    try:
        body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
        answer = send_raw(proxy.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"x-tailfloor-session: s-large\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d" % len(body),
                          body, timeout=30)
        assert answer.status == 200 and SENT - 40 < len(answer.body) < PROMISED
        name = "tailfloor_upstream_errors_total"
        assert proxy.sample("tailfloor_large_answers_total") == 1
        assert proxy.sample(name, kind="mid_stream") == 1
        assert proxy.sample(name, kind="connect") == proxy.sample(name, kind="timeout") == 0
        shown = session_json(proxy, "s-large")["session"]["requests"][0]
        assert shown["status"] == 200 and [a["broke"] for a in shown["attempts"]] == [
            "mid_stream"]
        page = fetch(session_url(proxy, "s-large"))[2]
        assert b"<dt>answer broke off</dt><dd>the upstream broke off its answer after its " \
               b"head; the client got it cut short</dd>" in page
        for span in spans_by_kind(receiver, 2):
            assert span.status.code == Status.STATUS_CODE_ERROR
            assert attributes(span.attributes)["error.type"] == "mid_stream"
    finally:
        proxy.stop()

"""Health, readiness, /metrics format, and draining on SIGTERM."""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy
from tests.streaming import stream_in_background


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_not_ready_until_both_ports_listen(clean_fake: FakeUpstream) -> None:
    """serve marks the start while its two listeners open: a probe that reaches the proxy
    port first must not report ready while the admin port still refuses connections."""
    proxy = InProcessProxy(clean_fake, before_start=lambda state: setattr(state, "starting",
                                                                         True))
    try:
        assert status_of(proxy.url + "/readyz") == 503
        assert status_of(proxy.admin_url + "/readyz") == 503
        assert status_of(proxy.url + "/healthz") == 200  # alive, only not ready
        proxy.loop.call_soon_threadsafe(setattr, proxy.state, "starting", False)
        deadline = time.monotonic() + 5
        while status_of(proxy.url + "/readyz") != 200:
            assert time.monotonic() < deadline, "still not ready once both ports listen"
            time.sleep(0.01)
    finally:
        proxy.stop()


def test_health_ready_and_metrics_parse(proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    assert status_of(proxy.url + "/healthz") == 200
    assert status_of(proxy.url + "/readyz") == 200
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=b'{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}')
    with urllib.request.urlopen(request, timeout=5):
        pass
    families = {f.name: f for f in text_string_to_metric_families(proxy.metrics_text())}
    for name in ("tailfloor_requests", "tailfloor_tokens", "tailfloor_request_duration_seconds",
                 "tailfloor_overhead_seconds", "tailfloor_in_flight_requests",
                 "tailfloor_time_to_first_token_seconds", "tailfloor_upstream_errors",
                 "tailfloor_client_disconnects"):
        assert name in families, name
    assert families["tailfloor_in_flight_requests"].samples[0].value == 0
    overhead = [s for s in families["tailfloor_overhead_seconds"].samples
                if s.name.endswith("_count") and s.labels["route"] == "chat_completions"]
    assert overhead and overhead[0].value >= 1
    assert proxy.sample("tailfloor_requests_total", route="chat_completions",
                        model="fake-model", code="200") >= 1


def test_model_labels_are_bounded(fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url, "--label-cap", "2")
    try:
        for index in range(4):
            body = orjson.dumps({"model": f"model-{index}", "messages": []})
            with urllib.request.urlopen(urllib.request.Request(
                    process.url + "/v1/chat/completions", data=body), timeout=5):
                pass
        models = {s.labels["model"] for f in text_string_to_metric_families(process.metrics_text())
                  if f.name == "tailfloor_requests" for s in f.samples}
        assert models == {"model-0", "model-1", "other"}
    finally:
        process.stop()


def test_only_vetted_models_become_labels(fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    # 64 made-up names the upstream refuses take no label slot; a credential-looking name the
    # upstream accepts never reaches /metrics; the real model keeps its own label.
    process = ProxyProcess(fake.url, "--label-cap", "4")
    secret = "sk-CANARYMODEL0123456789"

    def chat(model: str) -> None:
        body = orjson.dumps({"model": model, "messages": []})
        try:
            with urllib.request.urlopen(urllib.request.Request(
                    process.url + "/v1/chat/completions", data=body), timeout=5):
                pass
        except urllib.error.HTTPError:
            pass

    try:
        clean_fake.script.extend(Reply(status=404, error={"message": "no such model",
                                                          "type": "invalid_request_error"})
                                 for _ in range(64))
        for index in range(64):
            chat(f"junk-{index}")
        chat(secret)
        chat("real-model")
        text = process.metrics_text()
        models = {s.labels["model"] for f in text_string_to_metric_families(text)
                  if f.name == "tailfloor_requests" for s in f.samples}
        assert models == {"real-model", "other"}, models
        assert "CANARYMODEL" not in text
    finally:
        process.stop()


def test_sigterm_drains_in_flight_streams(fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url, "--shutdown-grace", "5")
    clean_fake.script.append(Reply(delay_between_chunks=0.2, text="abcdefgh", pieces=4))
    worker, result = stream_in_background(process.port)
    time.sleep(0.3)
    process.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    refused = False
    try:
        urllib.request.urlopen(process.url + "/healthz", timeout=1)
    except OSError:
        refused = True
    worker.join(10)
    assert process.proc.wait(10) == 0
    process.stop()
    assert refused, "new connections must be refused while draining"
    assert result["body"].endswith(b"data: [DONE]\n\n")
    assert b'"content":"gh"' in result["body"]


def _sigterm_while_sending(fake: FakeUpstream, sent: bytes, pause: float
                           ) -> tuple[bytes, float]:
    """A proxy with 4 s of grace gets ``sent`` (a request whose body has not all come),
    then SIGTERM ``pause`` seconds later: the raw answer (read until its JSON body ends or
    the connection closes) and how long it took after the signal; the proxy exited 0."""
    process = ProxyProcess(fake.url, "--shutdown-grace", "4")
    sock = socket.create_connection(("127.0.0.1", process.port), timeout=10)
    try:
        sock.sendall(sent)
        time.sleep(pause)
        began = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        waited = time.monotonic() - began
    finally:
        sock.close()
    assert process.proc.wait(10) == 0
    process.stop()
    return answer, waited


def test_sigterm_answers_a_request_whose_body_is_still_arriving(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    """The body never completes: the request is refused with the dialect's 503
    (shutting_down) within the drain, not left to the drain's end without an answer."""
    body = b'{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
    answer, waited = _sigterm_while_sending(
        fake, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b"\r\nanthropic-version: 2023-06-01\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body[:20], 0.3)
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    payload = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert payload["type"] == "error"  # Anthropic's shape
    assert "shutting down" in payload["error"]["message"]
    assert waited < 4.0


@pytest.mark.parametrize("kind", ["embeddings", "chat-past-the-parse-bound"])
def test_sigterm_answers_a_forwarded_body_still_arriving(
        fake: FakeUpstream, clean_fake: FakeUpstream, kind: str) -> None:
    """A body forwarded as it streams in (another route's, or a chat body too large to parse,
    whose start already went upstream) and never completed: refused with 503 shutting_down
    within the drain too, not cut without an answer when the process stops."""
    if kind == "embeddings":
        path, sent, length = b"/v1/embeddings", b'{"model":"e","input":"', 4096
    else:
        start = b'{"model":"m","messages":[{"role":"user","content":"'
        path, sent = b"/v1/chat/completions", start + b"x" * (9 * 1024 * 1024)
        length = len(sent) + 4096
    answer, waited = _sigterm_while_sending(
        fake, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/json\r\nContent-Length: %d\r\n\r\n" % length + sent,
        0.5)  # forwarding: the upstream has the start of the body
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    payload = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert payload["error"]["code"] == "shutting_down", payload
    assert waited < 4.0

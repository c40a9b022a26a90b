"""Every answer tailfloor makes itself is OpenAI-shaped, client mistakes are not our errors,
and a bounded fuzz of chat bodies through a real ``tailfloor serve`` never gets a non-JSON
answer or a 5xx, leaves no traceback in the log and leaves the proxy fast."""

from __future__ import annotations

import random
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.e2e.rawhttp import send_raw
from tests.fake_upstream import FakeUpstream, Reply
from tests.hostile_bodies import fuzzed

CANARIES = ("CANARYPLAIN456", "gsk_CANARYGROQ0123456", "sk-CANARYOPENAI0123", "CANARYCOOKIE77")
MALFORMED = [
    b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer CANARYPLAIN456\x01\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nx-api-key: gsk_CANARYGROQ0123456\x7f\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\napi-key sk-CANARYOPENAI0123\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nCookie: s=CANARYCOOKIE77\x00\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
]


def _chat(port: int, body: bytes, **headers: str) -> Any:
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}")
    for name, value in headers.items():
        head += f"\r\n{name.replace('_', '-')}: {value}"
    return send_raw(port, head.encode(), body)


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        out = b""
        while piece := sock.recv(65536):
            out += piece
    return out


@pytest.fixture(params=["json", "text"])
def proxy_in(request: pytest.FixtureRequest, fake: FakeUpstream) -> Iterator[ProxyProcess]:
    process = ProxyProcess(fake.url, "--log-format", request.param, "--access-log")
    yield process
    process.stop()


def test_a_body_nested_past_the_serialiser_keeps_every_other_byte(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    # 300 levels parse but cannot be serialised again: adding include_usage to the client's
    # own stream_options replaces that member in place, and every other byte goes as it came.
    deep = "[" * 300 + "]" * 300
    body = ('{"model":"m","stream":true,"stream_options":{"x":1},'
            f'"messages":[{{"role":"user","content":{deep}}}]}}').encode()
    answer = _chat(proxy.port, body)
    assert answer.status == 200, answer.body[:200]
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert clean_fake.chat_requests()[-1].body == body.replace(
        b'{"x":1}', b'{"x":1,"include_usage":true}')


@pytest.mark.parametrize("messages", [
    [{"role": {"a": 1}, "content": "hi"}],  # an unhashable role
    [{"role": ["system"], "content": "x"}, {"role": "user", "content": {"text": 1}}],
    [{"role": "assistant", "tool_calls": {"id": 1}}, {"role": "tool", "tool_call_id": [1]}],
    [1, "x", None, {"role": "user", "content": [None, 1, {"type": {"t": 1}}]}],
])
def test_odd_message_shapes_reach_the_upstream(proxy: ProxyProcess, clean_fake: FakeUpstream,
                                               messages: list[Any]) -> None:
    clean_fake.script.append(Reply(text="ok"))
    body = orjson.dumps({"model": "m", "messages": messages})
    answer = _chat(proxy.port, body)
    assert answer.status == 200, answer.body[:300]
    assert clean_fake.chat_requests()[-1].body == body


def test_malformed_http_is_counted_and_logged_once_at_info_without_its_bytes(
        proxy_in: ProxyProcess) -> None:
    for data in MALFORMED:
        assert _raw(proxy_in.port, data).startswith(b"HTTP/1.")
    assert proxy_in.sample("tailfloor_rejected_requests_total",
                           reason="malformed_http") == len(MALFORMED)
    logs = proxy_in.logs()
    assert "Traceback" not in logs
    assert '"level":"error"' not in logs and " ERROR " not in logs, logs
    for canary in CANARIES:
        assert canary not in logs
    # One line for the burst, the rest counted in it later (at most one a minute).
    assert logs.count("malformed HTTP request refused") == 1


def test_secrets_in_logged_messages_are_redacted_in_every_format(
        proxy_in: ProxyProcess, clean_fake: FakeUpstream) -> None:
    # A refused header quotes its value in our own error answer's log line: whatever its
    # shape, the credential never reaches the log. The model name goes into the access log.
    body = orjson.dumps({"model": "sk-CANARYOPENAI0123", "messages": []})
    send_raw(proxy_in.port, b"POST /v1/chat/completions?key=CANARYPLAIN456 HTTP/1.1\r\nHost: t"
             b"\r\nAuthorization: Bearer gsk_CANARYGROQ0123456\r\nCookie: s=CANARYCOOKIE77\r\n"
             b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode(),
             body)
    logs = proxy_in.logs()
    for canary in CANARIES:
        assert canary not in logs


def test_fuzzed_chat_bodies_get_json_answers_and_no_5xx(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    rng = random.Random(20261201)
    clean_fake.script.extend(Reply(text="ok") for _ in range(20_000))
    deadline = time.monotonic() + 15
    sent = 0
    statuses: dict[int, int] = {}
    while time.monotonic() < deadline:
        body, headers = fuzzed(rng)
        answer = _chat(proxy.port, body, **headers)
        sent += 1
        statuses[answer.status] = statuses.get(answer.status, 0) + 1
        assert answer.status < 500, (body[:300], answer.status, answer.body[:300])
        kind = answer.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            assert answer.body.startswith(b"data: "), answer.body[:200]
        else:
            assert kind.startswith("application/json"), (body[:300], answer.body[:300])
            orjson.loads(answer.body)
    assert sent > 200, sent
    assert statuses.get(200, 0) > sent // 10, statuses  # most of the fuzz reached the upstream
    started = time.perf_counter()
    with urllib.request.urlopen(proxy.url + "/healthz", timeout=2) as response:
        assert response.status == 200
    assert time.perf_counter() - started < 0.5
    assert "Traceback" not in proxy.logs()

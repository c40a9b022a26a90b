"""Every answer tailfloor makes itself is OpenAI-shaped, client mistakes are not our errors,
and a bounded fuzz of chat bodies through a real ``tailfloor serve`` never gets a non-JSON
answer or a 5xx, leaves no traceback in the log and leaves the proxy fast."""

from __future__ import annotations

import gzip
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
        body, headers = _fuzzed(rng)
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


def _fuzzed(rng: random.Random) -> tuple[bytes, dict[str, str]]:
    """One chat body: a valid one with random parts replaced by random JSON of random depth,
    sometimes cut short, sometimes gzip (valid or not)."""
    body: dict[str, Any] = {
        "model": "fake", "stream": rng.random() < 0.5,
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "bash", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "out"}]}
    for _ in range(rng.randint(1, 4)):
        _mutate(body, rng)
    raw = orjson.dumps(body) if rng.random() < 0.95 else _deep(rng)
    if rng.random() < 0.05:
        raw = raw[:rng.randint(0, len(raw))]
    headers: dict[str, str] = {}
    if rng.random() < 0.05:
        headers["Content_Encoding"] = "gzip"
        raw = gzip.compress(raw) if rng.random() < 0.7 else raw
    return raw, headers


def _deep(rng: random.Random) -> bytes:
    depth = rng.randint(200, 1100)
    inner = "[" * depth + "]" * depth
    return (f'{{"model":"fake","stream":true,"stream_options":{{}},'
            f'"messages":[{{"role":"user","content":{inner}}}]}}').encode()


def _junk(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randint(0, 9 if depth < 6 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, -1, 2**63, 1e308, 3.5])
    if choice == 3:
        letters = "ab\u20ac\U0001f600\n\"\\{}[]"
        return "".join(rng.choice(letters) for _ in range(rng.randint(0, 40)))
    if choice == 4:
        return ""
    if choice == 5:
        return rng.choice(["user", "assistant", "tool", "system", "developer", "call_1"])
    if choice <= 7:
        return [_junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["role", "content", "tool_calls", "id", "type", "function", "name",
                        "arguments", "text", "tool_call_id", "x"]): _junk(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


def _mutate(node: Any, rng: random.Random) -> None:
    """Replace one random member somewhere inside ``node`` by junk."""
    while True:
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
        elif isinstance(node, list) and node:
            key = rng.randrange(len(node))
        else:
            return
        child = node[key]
        if not isinstance(child, dict | list) or not child or rng.random() < 0.35:
            node[key] = _junk(rng)
            return
        node = child

"""Hostile request targets and headers through a real ``tailfloor serve``, on raw sockets.

The oracle is the fake upstream's own record of every request it parsed (one per request
on a connection) and what a second client receives on the pooled connection.
"""

from __future__ import annotations

import time

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.e2e.rawhttp import send_raw
from tests.fake_upstream import FakeUpstream

# Decoded, this query ends client A's request and starts a second, slowly answered one on
# the upstream connection: on a proxy that forwards the decoded query, client B gets its answer.
SMUGGLE = ("a=1%20HTTP/1.1%0d%0aHost:%20x%0d%0a%0d%0aGET%20/v1/smuggled?fake_delay_ms=300"
           "%20HTTP/1.1%0d%0aX-Pad:%20z")


def _wait_idle(fake: FakeUpstream, count: int) -> None:
    """Give a smuggled request time to show up in the fake's log if there is one."""
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline and len(fake.received) <= count:
        time.sleep(0.02)


@pytest.mark.parametrize("route", ["passthrough", "chat"])
def test_crlf_in_the_query_never_starts_a_second_request(
        proxy: ProxyProcess, clean_fake: FakeUpstream, route: str) -> None:
    for _run in range(3):
        clean_fake.reset()
        if route == "passthrough":
            a = send_raw(proxy.port, f"GET /v1/models?{SMUGGLE} HTTP/1.1\r\nHost: t".encode())
        else:
            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            a = send_raw(proxy.port, f"POST /v1/chat/completions?{SMUGGLE} HTTP/1.1\r\n"
                         f"Host: t\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}".encode(), body)
        assert a.status == 200
        b = send_raw(proxy.port, b"GET /v1/echo-b HTTP/1.1\r\nHost: t\r\n"
                                 b"Authorization: Bearer key-of-b")
        assert b.status == 200
        assert orjson.loads(b.body)["path"] == "/v1/echo-b"
        _wait_idle(clean_fake, 2)
        paths = [r.path for r in clean_fake.received]
        assert len(paths) == 2, paths
        assert "/v1/smuggled" not in paths
        # The query reached the upstream exactly as the client encoded it.
        assert clean_fake.received[0].raw_path.endswith("?" + SMUGGLE)


def test_non_ascii_query_and_header_values_are_forwarded_as_their_bytes(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    answer = send_raw(proxy.port, "GET /v1/models?q=%E2%82%AC&r=%F0%9F%98%80 HTTP/1.1\r\n"
                                  "Host: t\r\nX-Note: prix 5 € 😀".encode())
    assert answer.status == 200
    seen = clean_fake.received[-1]
    assert seen.raw_path == "/v1/models?q=%E2%82%AC&r=%F0%9F%98%80"
    assert seen.headers["X-Note"] == "prix 5 € 😀"
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    answer = send_raw(proxy.port, f"POST /v1/chat/completions?tag=%C3%A9 HTTP/1.1\r\nHost: t"
                      f"\r\nContent-Type: application/json\r\nX-Note: € ok\r\n"
                      f"Content-Length: {len(chat)}".encode(), chat)
    assert answer.status == 200
    seen = clean_fake.received[-1]
    assert seen.raw_path == "/v1/chat/completions?tag=%C3%A9"
    assert seen.headers["X-Note"] == "€ ok"


def test_raw_non_ascii_in_the_target_is_refused_by_the_parser(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    # aiohttp's HTTP parser refuses it before any handler runs (a 400, never a 500).
    answer = send_raw(proxy.port, "GET /v1/models?r=€ HTTP/1.1\r\nHost: t".encode())
    assert answer.status == 400
    assert clean_fake.received == []


@pytest.mark.parametrize("target", [
    "/v1/%2e%2e/%2e%2e/admin", "/v1/../../admin", "/v1/x/..%2f..%2fadmin",
    "/v1/.%2E/admin", "/agents/a/v1/%2E%2e/secret", "/v1/x/..%5c..%5cadmin",
    "/v1/..;/admin", "/v1/%252e%252e/admin", "/v1/%c0%ae%c0%ae/admin",
])
def test_dot_segments_are_refused(proxy: ProxyProcess, clean_fake: FakeUpstream,
                                  target: str) -> None:
    for method in ("GET", "POST"):
        answer = send_raw(proxy.port, f"{method} {target} HTTP/1.1\r\nHost: t\r\n"
                                      "Content-Length: 2".encode(), b"{}")
        assert answer.status == 400
        error = orjson.loads(answer.body)["error"]
        assert error["code"] == "invalid_request_target"
    assert clean_fake.received == []


@pytest.mark.parametrize("agent", ["ops%0A", "ops%0D", "ops%00", "%0Aops"])
def test_an_agent_id_with_a_control_character_is_refused(proxy: ProxyProcess,
                                                         clean_fake: FakeUpstream,
                                                         agent: str) -> None:
    # "$" in a regex matches before a final line feed: the id would reach labels and spans.
    answer = send_raw(proxy.port, f"POST /agents/{agent}/v1/chat/completions HTTP/1.1\r\n"
                                  "Host: t\r\nContent-Length: 2".encode(), b"{}")
    assert answer.status == 400
    assert orjson.loads(answer.body)["error"]["code"] == "invalid_request_target"
    assert clean_fake.received == []


def test_absolute_form_uses_only_its_path(proxy: ProxyProcess,
                                          clean_fake: FakeUpstream) -> None:
    answer = send_raw(proxy.port, b"GET http://evil.example/v1/models?x=1 HTTP/1.1\r\n"
                                  b"Host: evil.example")
    assert answer.status == 200
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    answer = send_raw(proxy.port, b"POST http://evil.example/agents/ops/v1/chat/completions "
                      b"HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(chat)).encode(), chat)
    assert answer.status == 200
    assert "x-tailfloor" in answer.headers  # it went through the chat route
    assert [r.raw_path for r in clean_fake.received] == ["/v1/models?x=1",
                                                         "/v1/chat/completions"]
    assert all(r.headers["Host"].startswith("127.0.0.1:") for r in clean_fake.received)


def test_introspection_is_not_on_the_proxy_port(proxy: ProxyProcess,
                                                clean_fake: FakeUpstream) -> None:
    answer = send_raw(proxy.port, b"GET /tailfloor/sessions HTTP/1.1\r\nHost: t")
    assert answer.status == 404
    assert orjson.loads(answer.body)["error"]["code"] == "not_found"
    admin = send_raw(proxy.admin_port, b"GET /tailfloor/sessions HTTP/1.1\r\nHost: t")
    assert admin.status == 200 and "sessions" in orjson.loads(admin.body)
    for path in (b"/metrics", b"/healthz", b"/readyz"):
        for port in (proxy.port, proxy.admin_port):
            assert send_raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: t").status == 200
    # The admin listener is not a proxy: nothing it gets goes upstream.
    assert send_raw(proxy.admin_port, b"GET /v1/models HTTP/1.1\r\nHost: t").status == 404
    assert clean_fake.received == []


@pytest.mark.parametrize("path", ["/v1//chat/completions", "/v1/chat/completions/",
                                  "/v1/chat%2Fcompletions"])
def test_spellings_of_the_chat_path_take_the_chat_route(
        proxy: ProxyProcess, clean_fake: FakeUpstream, path: str) -> None:
    chat = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    answer = send_raw(proxy.port, f"POST {path} HTTP/1.1\r\nHost: t\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(chat)}"
                      .encode(), chat)
    assert "x-tailfloor" in answer.headers  # the floor saw it
    assert clean_fake.received[-1].raw_path == path  # the upstream gets it as sent


def test_transfer_codings_other_than_chunked_are_refused(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    answer = send_raw(proxy.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\n"
                      b"Transfer-Encoding: gzip, chunked", b"0\r\n\r\n")
    assert answer.status == 400
    assert orjson.loads(answer.body)["error"]["code"] == "invalid_header"
    assert clean_fake.received == []


def test_introspection_can_be_switched_off(fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url, "--no-introspection")
    try:
        answer = send_raw(process.admin_port, b"GET /tailfloor/sessions HTTP/1.1\r\nHost: t")
        assert answer.status == 404
        assert send_raw(process.admin_port, b"GET /metrics HTTP/1.1\r\nHost: t").status == 200
    finally:
        process.stop()

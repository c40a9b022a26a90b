"""Slow and idle clients cannot exhaust the proxy: a connection that does not finish its
request head, or idles after an answer, is closed after --idle-timeout; a chat body slower
than --min-body-rate gets 408; connections beyond --max-connections get a clear 503, and
readiness turns false near the limit while health stays fine."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def strict(fake: FakeUpstream) -> Iterator[ProxyProcess]:
    process = ProxyProcess(fake.url, "--idle-timeout", "1", "--min-body-rate", "1000",
                           "--max-connections", "6")
    yield process
    process.stop()


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    got = b""
    try:
        while piece := sock.recv(65536):
            got += piece
    except TimeoutError:
        return False, got
    return True, got


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_a_head_that_never_ends_and_an_idle_connection_are_closed(strict: ProxyProcess) -> None:
    slow = socket.create_connection(("127.0.0.1", strict.port))
    slow.sendall(b"GET /v1/models HTTP/1.1\r\nHo")
    idle = socket.create_connection(("127.0.0.1", strict.port))
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    started = time.monotonic()
    closed, _ = _closed_within(slow, 5)
    assert closed and time.monotonic() - started < 3
    closed, answer = _closed_within(idle, 5)
    assert closed and answer.startswith(b"HTTP/1.1 200")
    slow.close()
    idle.close()


def test_a_body_slower_than_the_minimum_rate_gets_408(strict: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", strict.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
        started = time.monotonic()
        closed, answer = _closed_within(sock, 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"request_timeout"' in answer
    # 1 s of grace + 1,000 bytes at 1,000 bytes/s, then at most 2 s of draining
    assert closed and time.monotonic() - started < 6


def test_a_slow_body_on_another_route_is_cut_off_too(strict: ProxyProcess,
                                                      clean_fake: FakeUpstream) -> None:
    with socket.create_connection(("127.0.0.1", strict.port)) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 1000\r\n\r\n{\"input\":")
        started = time.monotonic()
        closed, answer = _closed_within(sock, 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert closed and time.monotonic() - started < 6


def test_connections_beyond_the_cap_are_refused_clearly(strict: ProxyProcess) -> None:
    held = [socket.create_connection(("127.0.0.1", strict.port)) for _ in range(6)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", strict.port))
        closed, answer = _closed_within(extra, 3)
        extra.close()
        assert closed and answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"Retry-After: 1" in answer and b'"code":"too_many_connections"' in answer
        assert _status(strict.admin_url + "/readyz") == 503
        assert _status(strict.admin_url + "/healthz") == 200
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 3
    while _status(strict.admin_url + "/readyz") != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _status(strict.admin_url + "/readyz") == 200
    assert _status(strict.url + "/v1/models") == 200
    assert strict.sample("tailfloor_rejected_requests_total",
                         reason="too_many_connections") >= 1

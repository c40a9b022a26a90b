"""A compressed chat body holds the body budget by what it sent, not by what it decodes to,
until it has all arrived; and a body that sends a little and stops is cut off after the grace
plus what it sent at --min-body-rate, not after the time its declared length would take.

The "zip bomb" here is a few KB of gzip that decode to 3 MiB, sent chunked without its last
bytes, then silence. Decoded as it arrived (the old way), it held 3 MiB of a 4 MiB budget for
as long as the largest body may take at the minimum rate: hours. An honest 2 MiB request sent
meanwhile then found no room (503 busy)."""

from __future__ import annotations

import base64
import gzip
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.e2e.test_slow_clients import _closed_within
from tests.fake_upstream import FakeUpstream

BUDGET = 4 * 1024 * 1024
GRACE, RATE = 3, 1000  # --idle-timeout (the grace), --min-body-rate


@pytest.fixture(scope="module")
def tight(fake: FakeUpstream) -> Iterator[ProxyProcess]:
    process = ProxyProcess(fake.url, "--max-buffered-bytes", str(BUDGET),
                           "--idle-timeout", str(GRACE), "--min-body-rate", str(RATE))
    yield process
    process.stop()


def _bomb() -> bytes:
    text = b"a" * (3 * 1024 * 1024)
    body = b'{"model":"m","messages":[{"role":"user","content":"' + text + b'"}]}'
    packed = gzip.compress(body, compresslevel=9)
    assert len(packed) < 16 * 1024  # a few KB on the wire
    return packed


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _answer(sock: socket.socket, seconds: float) -> bytes:
    """What arrived until the connection closed or ``seconds`` passed."""
    return _closed_within(sock, seconds)[1]


def test_a_stalled_zip_bomb_holds_what_it_sent_and_is_cut_off_by_its_pace(
        tight: ProxyProcess, clean_fake: FakeUpstream) -> None:
    packed = _bomb()
    sent = packed[:-8]  # all but the gzip trailer: the body cannot end
    with socket.create_connection(("127.0.0.1", tight.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                     b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n"
                     + f"{len(sent):x}\r\n".encode() + sent + b"\r\n")
        started = time.monotonic()
        time.sleep(0.5)  # the proxy has the bytes and (the old way) their 3 MiB decoded

        honest = orjson.dumps({"model": "m", "messages": [
            {"role": "user", "content": "b" * (2 * 1024 * 1024)}]})
        assert _post(tight.url, honest) == 200
        forwarded = [r for r in clean_fake.chat_requests() if len(r.body) >= len(honest)]
        assert forwarded and forwarded[-1].body == honest

        answer = _answer(sock, GRACE + len(sent) / RATE + 10)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"request_timeout"' in answer
    # the grace and a second per RATE bytes sent, then the answer; not the hours that
    # --max-body-bytes at RATE bytes/s would take
    assert waited < GRACE + len(sent) / RATE + 10


def test_a_plain_chunked_body_that_stops_is_cut_off_by_what_it_sent(
        tight: ProxyProcess) -> None:
    start = b'{"model":"m","messages":[{"role":"user","content":"' + b"c" * 2000
    with socket.create_connection(("127.0.0.1", tight.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(start):x}\r\n".encode() + start + b"\r\n")
        started = time.monotonic()
        answer = _answer(sock, GRACE + len(start) / RATE + 10)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert waited < GRACE + len(start) / RATE + 10


def _chunked_gzip(port: int, body: bytes, piece: int) -> bytes:
    """``body`` gzipped and sent chunked, ``piece`` bytes a chunk, a moment between the
    first chunks (so the body does not arrive with the head); the raw answer."""
    packed = gzip.compress(body, compresslevel=6)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for index, start in enumerate(range(0, len(packed), piece)):
            chunk = packed[start:start + piece]
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            if index < 3:
                time.sleep(0.05)
        sock.sendall(b"0\r\n\r\n")
        return _answer(sock, 30)


@pytest.mark.parametrize("kind", ["decodes-past-the-bound", "compressed-past-the-bound"])
def test_a_compressed_body_past_the_parse_bound_reaches_the_upstream_whole(
        proxy: ProxyProcess, clean_fake: FakeUpstream, kind: str) -> None:
    """Held compressed until it ended (a small packet of a large text), or until its
    compressed bytes passed the bound (text that does not compress): either way forwarded
    unread and whole, decoded."""
    if kind == "decodes-past-the-bound":
        text = b"d" * (10 * 1024 * 1024)
    else:
        text = base64.b64encode(os.urandom(9 * 1024 * 1024))  # 12 MiB, ~9 MiB gzipped
    body = b'{"model":"m","messages":[{"role":"user","content":"' + text + b'"}]}'
    answer = _chunked_gzip(proxy.port, body, 256 * 1024)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b"too_large" in answer.split(b"\r\n\r\n", 1)[0]  # x-tailfloor: forwarded unread
    forwarded = [r for r in clean_fake.chat_requests() if len(r.body) >= len(body)]
    assert forwarded and forwarded[-1].body == body

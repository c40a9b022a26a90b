"""Memory is bounded whatever the upstream or the clients send: an error answer is read up
to what a decision needs, a large complete answer is passed on as it arrives, and request
bodies held at once stay within a budget (503 busy beyond it)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.conftest import ProxyProcess
from tests.e2e.rawhttp import dechunk, send_raw
from tests.fake_upstream import FakeUpstream, Reply

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _post(port: int, body: bytes = CHAT) -> object:
    return send_raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                    b"Content-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode(), body, timeout=60)


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")



@pytest.fixture(scope="module")
def proxy(fake: FakeUpstream) -> Iterator[ProxyProcess]:
    """A real process: these tests read its resident memory."""
    process = ProxyProcess(fake.url)
    yield process
    process.stop()


def test_a_huge_error_answer_is_a_502_and_never_held(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    junk = b'{"error":{"message":"' + b"x" * (5 * 1024 * 1024) + b'"}}'
    clean_fake.script.append(Reply(status=500, raw_body=junk))
    answer = _post(proxy.port)
    assert answer.status == 502  # type: ignore[attr-defined]
    error = answer.json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == "upstream_answer_too_large"
    # The pooled connection that still held the rest was dropped, not reused.
    clean_fake.script.append(Reply(text="after"))
    assert b"after" in _post(proxy.port).body  # type: ignore[attr-defined]


def test_a_large_complete_answer_passes_through_as_it_arrives(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    body = orjson.dumps({"id": "x", "object": "chat.completion", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "y" * (60 * 1024 * 1024)},
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                             "total_tokens": 3}})
    clean_fake.script.append(Reply(status=200, raw_body=body))
    before = _peak_rss_mb(proxy.proc.pid)
    answer = _post(proxy.port)
    assert answer.status == 200  # type: ignore[attr-defined]
    assert answer.body == body  # type: ignore[attr-defined]
    grown = _peak_rss_mb(proxy.proc.pid) - before
    # Held and joined it would cost over 120 MB; passed on, a few buffers' worth.
    assert grown < 40, f"peak RSS grew {grown:.0f} MB for a 60 MB answer"
    assert proxy.sample("tailfloor_large_answers_total") == 1


def test_request_bodies_held_at_once_stay_within_the_budget(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url, "--max-buffered-bytes", str(1024 * 1024))
    try:
        big = orjson.dumps({"model": "m", "messages": [
            {"role": "user", "content": "z" * (700 * 1024)}]})
        clean_fake.script.extend([Reply(text="slow", delay_before_headers=1.5),
                                  Reply(text="third")])
        first: dict[str, object] = {}
        thread = threading.Thread(target=lambda: first.update(answer=_post(process.port, big)))
        thread.start()
        deadline = time.monotonic() + 5
        while not clean_fake.chat_requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        second = _post(process.port, big)
        assert second.status == 503  # type: ignore[attr-defined]
        assert second.headers["retry-after"] == "1"  # type: ignore[attr-defined]
        assert second.json()["error"]["code"] == "busy"  # type: ignore[attr-defined]
        thread.join(10)
        assert first["answer"].status == 200  # type: ignore[attr-defined]
        third = _post(process.port, big)  # the budget was given back
        assert third.status == 200 and b"third" in third.body  # type: ignore[attr-defined]
        assert len(clean_fake.chat_requests()) == 2
        # A declared length holds nothing until its bytes arrive: a client that announces
        # 900 KB and sends 10 bytes does not lock the others out.
        with socket.create_connection(("127.0.0.1", process.port)) as stalled:
            stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                            b"Content-Type: application/json\r\nContent-Length: 900000"
                            b"\r\n\r\n{\"model\":")
            time.sleep(0.2)
            clean_fake.script.append(Reply(text="fourth"))
            fourth = _post(process.port, big)
            assert fourth.status == 200 and b"fourth" in fourth.body  # type: ignore[attr-defined]
    finally:
        process.stop()


def test_a_stream_to_a_client_that_stops_reading_waits_for_it(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    # The relay writes from the upstream's callback: without backpressure a client that does
    # not read would have the whole stream held in tailfloor's write buffer.
    text = "z" * (60 * 1024 * 1024)
    clean_fake.script.append(Reply(text=text, pieces=600))
    body = orjson.dumps({"model": "m", "stream": True, "stream_options": {
        "include_usage": True}, "messages": [{"role": "user", "content": "hi"}]})
    before = _peak_rss_mb(proxy.proc.pid)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", proxy.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                     % (len(body), body))
        time.sleep(2.0)  # not reading while the upstream has all of it ready to send
        held = _peak_rss_mb(proxy.proc.pid) - before
        parts = []
        while piece := sock.recv(1 << 20):
            parts.append(piece)
    raw = b"".join(parts)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    content = "".join(
        orjson.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in dechunk(rest).split(b"\n\n")
        if line.startswith(b"data: {") and b'"choices":[{' in line)
    assert content == text  # nothing lost or reordered while reading was paused
    assert held < 30, f"peak RSS grew {held:.0f} MB while the client did not read"

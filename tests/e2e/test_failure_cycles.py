"""A failed request leaves no frame of tailfloor's behind: none in a reference cycle, none
held by what outlives the request.

An exception's traceback holds every frame it was raised through, and those frames hold the
upstream connection, the trail, the relay's outcome. When one of them also keeps the
exception, the lot is a cycle that only the garbage collector frees, and one alive during a
full collection is frozen until the hourly thaw (``proxy/server/full_collections.py``).
A frame held by what the inspector keeps of a finished request is worse: it holds the
request's parsed body, past the inspector's memory budget. Under an upstream outage every
request fails so. The oracle is the collector itself: with ``gc.DEBUG_SAVEALL`` everything it
finds unreachable stays in ``gc.garbage``, and ``gc.get_objects`` lists what is still held.
"""

from __future__ import annotations

import gc
import http.client
import socket
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType

import orjson
import pytest

from tests.conftest import wait_for_sample
from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy

MESSAGES = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 40}
            for i in range(40)]
REQUESTS = 6


@pytest.fixture
def failing_proxy(clean_fake: FakeUpstream) -> Iterator[InProcessProxy]:
    built = InProcessProxy(clean_fake, "--read-timeout", "0.5")
    yield built
    built.stop()


def _body(stream: bool) -> bytes:
    return orjson.dumps({"model": "m", "stream": stream, "messages": MESSAGES})


def _post(port: int, body: bytes) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", body,
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def _leave_mid_stream(port: int, body: bytes) -> int:
    """Send a streamed request, read the head and a first event, and hang up."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                       b"Content-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert client.recv(200).startswith(b"HTTP/1.1 200")
    return 0


def _running_frames() -> set[int]:
    """The frames on some thread's stack now (each thread's code that is running)."""
    running: set[int] = set()
    for frame in sys._current_frames().values():
        walked: FrameType | None = frame
        while walked is not None:
            running.add(id(walked))
            walked = walked.f_back
    return running


def _our_frames_left(proxy: InProcessProxy, send: Callable[[], int]) -> list[str]:
    """Run ``send`` ``REQUESTS`` times; then the frames of tailfloor's code still held once
    every request has ended: in a cycle (found unreachable by the collector) or by something
    that outlives the request (the inspector keeps a finished request's facts)."""
    before = proxy.sample("tailfloor_requests_total")
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        statuses = [send() for _ in range(REQUESTS)]
        wait_for_sample(proxy, "tailfloor_requests_total", before + REQUESTS)
        gc.collect()
        running = _running_frames()
        found = [f"{item.f_code.co_filename}:{item.f_code.co_name}"
                 for item in (*gc.garbage, *gc.get_objects())
                 if isinstance(item, FrameType) and "/proxy/" in item.f_code.co_filename
                 and id(item) not in running]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert len(statuses) == REQUESTS
    return found


def test_an_upstream_that_does_not_answer_in_time(failing_proxy: InProcessProxy,
                                                  clean_fake: FakeUpstream) -> None:
    def send() -> int:
        clean_fake.script.append(Reply(delay_before_headers=1.5))
        status = _post(failing_proxy.port, _body(True))
        assert status == 504
        return status

    assert _our_frames_left(failing_proxy, send) == []


def test_an_upstream_that_breaks_the_stream(failing_proxy: InProcessProxy,
                                            clean_fake: FakeUpstream) -> None:
    def send() -> int:
        clean_fake.script.append(Reply(close_after_chunks=2))
        return _post(failing_proxy.port, _body(True))

    assert _our_frames_left(failing_proxy, send) == []


def test_a_client_that_leaves_mid_stream(failing_proxy: InProcessProxy,
                                         clean_fake: FakeUpstream) -> None:
    def send() -> int:
        clean_fake.script.append(Reply(delay_between_chunks=0.2, pieces=10))
        return _leave_mid_stream(failing_proxy.port, _body(True))

    assert _our_frames_left(failing_proxy, send) == []


def test_an_upstream_that_cannot_be_reached(failing_proxy: InProcessProxy,
                                            clean_fake: FakeUpstream) -> None:
    failing_proxy._unix = clean_fake.unix_path + ".gone"  # the transport seam's socket

    def send() -> int:
        status = _post(failing_proxy.port, _body(False))
        assert status == 502
        return status

    assert _our_frames_left(failing_proxy, send) == []


def _leave_before_the_head(port: int, body: bytes) -> int:
    """Send a request and hang up while the upstream still thinks."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                       b"Content-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.2)
    return 0


def test_a_client_that_leaves_before_the_answer(failing_proxy: InProcessProxy,
                                                clean_fake: FakeUpstream) -> None:
    def send() -> int:
        clean_fake.script.append(Reply(delay_before_headers=0.4))
        return _leave_before_the_head(failing_proxy.port, _body(True))

    assert _our_frames_left(failing_proxy, send) == []

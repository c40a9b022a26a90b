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
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TypeGuard

import orjson
import pytest

from tests.conftest import wait_for_sample
from tests.e2e.rawhttp import read_request
from tests.e2e.test_faults import post
from tests.fake_upstream import FakeUpstream, Reply
from tests.inprocess import InProcessProxy

MESSAGES = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 40}
            for i in range(40)]
REQUESTS = 6
CHAT = "/v1/chat/completions"


@pytest.fixture
def failing_proxy(clean_fake: FakeUpstream) -> Iterator[InProcessProxy]:
    built = InProcessProxy(clean_fake, "--read-timeout", "0.5")
    yield built
    built.stop()


def _body(stream: bool) -> bytes:
    return orjson.dumps({"model": "m", "stream": stream, "messages": MESSAGES})


def _leave(port: int, body: bytes, *, after_the_head: bool) -> int:
    """Send a request and hang up: once the head and a first event came, or while the
    upstream still thinks."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                       b"Content-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if after_the_head:
            assert client.recv(200).startswith(b"HTTP/1.1 200")
        else:
            time.sleep(0.2)
    return 0


def _ours(item: object) -> TypeGuard[FrameType]:
    return isinstance(item, FrameType) and "/proxy/" in item.f_code.co_filename


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
    # Those of earlier requests (another case's) are not this one's: held, so that no new
    # frame takes the id of one.
    earlier = [item for item in gc.get_objects() if _ours(item)]
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        statuses = [send() for _ in range(REQUESTS)]
        wait_for_sample(proxy, "tailfloor_requests_total", before + REQUESTS)
        # A worker thread may still hold the error it handed back for a moment after the
        # answer went out (preempted before its frame ends): looked at again for up to a
        # second. A cycle stays in ``gc.garbage`` whatever the wait.
        for _ in range(10):
            gc.collect()
            known = _running_frames() | {id(item) for item in earlier}
            found = [f"{item.f_code.co_filename}:{item.f_code.co_name}"
                     for item in (*gc.garbage, *gc.get_objects())
                     if _ours(item) and id(item) not in known]
            if not found:
                break
            time.sleep(0.1)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert len(statuses) == REQUESTS
    return found


# What the upstream does, whether the client hangs up (after the head, before it), and the
# status the client gets when it stays. The two clients that leave made no cycle of ours
# before ``errors.unlinked`` either: they guard the cancellation paths.
FAILURES = {
    "an upstream that does not answer in time": (Reply(delay_before_headers=1.5), None, 504),
    "an upstream that breaks the stream": (Reply(close_after_chunks=2), None, 200),
    "a client that leaves mid-stream": (Reply(delay_between_chunks=0.1, pieces=10), True, 0),
    "a client that leaves before the answer": (Reply(delay_before_headers=0.4), False, 0),
    "an upstream that cannot be reached": (None, None, 502),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failed_request_leaves_no_frame_behind(failure: str, failing_proxy: InProcessProxy,
                                                 clean_fake: FakeUpstream) -> None:
    reply, leaves_after_the_head, status = FAILURES[failure]
    if reply is None:
        failing_proxy._unix = clean_fake.unix_path + ".gone"  # the transport seam's socket

    def send() -> int:
        if reply is not None:
            clean_fake.script.append(reply)
        if leaves_after_the_head is not None:
            return _leave(failing_proxy.port, _body(True), after_the_head=leaves_after_the_head)
        got = post(failing_proxy.url + CHAT, _body(reply is not None))[0]
        assert got == status
        return got

    assert _our_frames_left(failing_proxy, send) == []


def test_a_large_body_that_is_not_json(failing_proxy: InProcessProxy) -> None:
    """Parsed in a worker thread (over 256 KiB): the future that brings its error back."""
    body = b'{"model": "m", "messages": [' + b'{"role": "user", "content": "x"},' * 12_000

    def send() -> int:
        status = post(failing_proxy.url + CHAT, body + b"nope")[0]
        assert status == 400
        return status

    assert _our_frames_left(failing_proxy, send) == []


def _closes_kept_connections(path: str) -> tuple[socket.socket, list[int]]:
    """An upstream on a UNIX socket that answers the first request of a connection, keeps it
    open, and closes it when the next one comes: every request after the first finds its
    kept-alive connection closed and is sent again on a new one. Also: a count of the
    requests the closed connections were sent (one a connection but the last)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    answer = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"},
         "finish_reason": "stop"}]})

    def serve(connection: socket.socket) -> None:
        with connection:
            if read_request(connection) is None:
                return
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                               + f"Content-Length: {len(answer)}\r\n\r\n".encode() + answer)
            if connection.recv(65536):  # the next request: closed instead of answered
                refused.append(1)

    refused: list[int] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, refused


def test_a_kept_alive_connection_the_upstream_closed(failing_proxy: InProcessProxy,
                                                     tmp_path: Path) -> None:
    path = str(tmp_path / "upstream.sock")
    listener, refused = _closes_kept_connections(path)
    failing_proxy._unix = path  # the transport seam's socket
    try:
        def send() -> int:
            status = post(failing_proxy.url + CHAT, _body(False))[0]
            assert status == 200
            return status

        assert _our_frames_left(failing_proxy, send) == []
        assert failing_proxy.sample("tailfloor_upstream_errors_total") == 0  # retried, not lost
        assert len(refused) >= REQUESTS - 1  # each found its kept connection closed
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which then ends
        listener.close()

"""The proxy's side of the health process, on an event loop of the test's own with a real
health process: the loop is woken by probes only (never while nobody probes), and /readyz
says what the loop says at the moment of the probe."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from proxy.health.verdict import INDEXING, READY
from proxy.server.health import HealthProcess


def probe(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Loop:
    """A HealthProcess answering on an event loop in a thread; ``asked`` counts the times
    the loop computed its readiness (each question it answered)."""

    def __init__(self) -> None:
        self.asked = 0
        self.code = INDEXING
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.health = HealthProcess.bind("127.0.0.1", 0, 10.0)
        self.health.readiness = self.readiness
        self.call(self.health.start, self.loop)

    def readiness(self) -> int:
        self.asked += 1
        return self.code

    def call(self, function: object, *args: object) -> None:
        async def run() -> None:
            function(*args)  # type: ignore[operator]
        asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)

    def stop(self) -> None:
        self.call(self.health.detach)
        self.health.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def answering() -> Iterator[Loop]:
    loop = Loop()
    try:
        yield loop
    finally:
        loop.stop()


def test_nobody_probing_wakes_nothing(answering: Loop) -> None:
    time.sleep(1.5)  # the health process is up and idle meanwhile
    assert answering.asked == 0
    for _ in range(3):
        assert probe(answering.health.address, "/healthz") == (200, "ok\n")
        time.sleep(0.2)
    assert answering.asked == 3  # one question a probe, each answered before the next
    time.sleep(1.0)
    assert answering.asked == 3


def test_readyz_says_what_the_loop_says_now(answering: Loop) -> None:
    address = answering.health.address
    assert probe(address, "/readyz") == (503, "not ready: indexing transcripts\n")
    answering.code = READY
    assert probe(address, "/readyz") == (200, "ready\n")  # not the answer of the probe before
    answering.code = INDEXING
    assert probe(address, "/readyz") == (503, "not ready: indexing transcripts\n")
    assert probe(address, "/healthz") == (200, "ok\n")


def test_a_readiness_check_that_raises_reads_as_not_ready(answering: Loop) -> None:
    def broken() -> int:
        raise RuntimeError("a bug")
    answering.health.readiness = broken
    assert probe(answering.health.address, "/readyz") == (503, "not ready\n")
    assert probe(answering.health.address, "/healthz") == (200, "ok\n")

"""One export post against real sockets: a timer that fired too late for its post leaves
the next post alone, and the connect phase (resolving, connecting, the TLS handshake) is
within the post's bound."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.telemetry.exporting import Endpoint
from tests.e2e.rawhttp import read_request
from tests.otlp_receiver import OtlpReceiver
from tests.telemetry.socket_collector import SocketCollector


class KeptAliveCollector(SocketCollector):
    """Answers each request on a kept-alive connection, the n-th after ``holds[n]`` s;
    counts the connections it accepted."""

    def __init__(self, holds: list[float]) -> None:
        self.holds = holds
        self._answered = 0
        super().__init__()

    def answer(self, client: socket.socket) -> None:
        client.settimeout(10)
        pending = b""
        while True:
            request = read_request(client, pending)
            if request is None:
                return
            pending = request[2]
            hold = self.holds[self._answered] if self._answered < len(self.holds) else 0.0
            self._answered += 1
            if self.stopped(hold):
                return
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def test_an_abort_that_comes_too_late_never_closes_the_next_posts_socket() -> None:
    # The abort meant for the first post arrives while the second, on the same kept-alive
    # socket, waits for its answer (as a late watchdog can on a loaded machine).
    collector = KeptAliveCollector(holds=[0.0, 1.5])
    try:
        endpoint = Endpoint(collector.url, {})
        assert endpoint.post(b"\x0a\x00", timeout=0.5)
        thread, result = in_thread(endpoint, 10.0)
        time.sleep(0.5)  # the second post is under way
        endpoint._abort(1)  # the first post's abort, too late
        thread.join(8)
        assert result == [True]
        assert collector.connections == 1
        endpoint.close()
    finally:
        collector.close()


def test_a_post_past_its_time_is_ended_by_the_watchdog_and_the_next_one_works() -> None:
    collector = KeptAliveCollector(holds=[3.0, 0.0])
    try:
        endpoint = Endpoint(collector.url, {})
        began = time.monotonic()
        assert endpoint.post(b"\x0a\x00", timeout=0.5) is False
        assert time.monotonic() - began < 2.0  # generous: the bound is 0.5 s
        assert endpoint.post(b"\x0a\x00", timeout=5.0)  # a new connection
        assert collector.connections == 2
        endpoint.close()
    finally:
        collector.close()


def test_ending_an_endpoint_ends_its_watchdog_and_a_post_starts_it_again() -> None:
    collector = OtlpReceiver(keep_alive=True)
    url = collector.url + "/v1/traces"

    def watchdogs() -> int:
        return sum(t.name == "tailfloor-otlp-watchdog" for t in threading.enumerate())

    try:
        before = watchdogs()
        endpoints = [Endpoint(url, {}) for _ in range(3)]
        for endpoint in endpoints:
            assert endpoint.post(b"\x0a\x00", timeout=5.0)
        assert watchdogs() == before + 3
        endpoints[1].close()  # a connection closed (as after a failed post): still watched
        assert watchdogs() == before + 3
        for endpoint in endpoints:
            endpoint.end()
        deadline = time.monotonic() + 5
        while watchdogs() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watchdogs() == before  # not after the minute an idle one waits
        assert endpoints[0].post(b"\x0a\x00", timeout=5.0)  # armed again, watched again
        assert watchdogs() == before + 1
        endpoints[0].end()
    finally:
        collector.stop()


def in_thread(endpoint: Endpoint, timeout: float) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(endpoint.post(b"\x0a\x00",
                                                                          timeout)),
                              daemon=True)
    thread.start()
    return thread, result


class HangingResolver:
    """Stands for getaddrinfo on a resolver that does not answer; counts the lookups."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lookups = 0

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        self.lookups += 1
        self.release.wait(60)
        raise socket.gaierror("released")


@pytest.fixture
def hanging_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[HangingResolver]:
    resolver = HangingResolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    yield resolver
    resolver.release.set()


def test_a_resolver_that_hangs_is_bounded_by_the_post(
        hanging_resolver: HangingResolver) -> None:
    endpoint = Endpoint("http://collector.invalid:4318/v1/traces", {})
    thread, result = in_thread(endpoint, 0.5)
    thread.join(8)  # generous: the bound is 0.5 s
    assert not thread.is_alive() and result == [False]
    # While that lookup still hangs, the next post fails without starting another.
    thread, result = in_thread(endpoint, 0.5)
    thread.join(8)
    assert not thread.is_alive() and result == [False]
    assert hanging_resolver.lookups == 1


def full_backlog() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket that never accepts, its backlog filled: a connect to it hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(server.getsockname())
        fillers.append(filler)
    return server, fillers


def test_a_connect_that_hangs_on_every_address_is_bounded_by_the_post_as_a_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = [full_backlog() for _ in range(3)]
    addresses = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", server.getsockname())
                 for server, _ in listeners]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *_a, **_k: addresses)
    try:
        endpoint = Endpoint("http://collector.test:4318/v1/traces", {})
        thread, result = in_thread(endpoint, 1.0)
        # Each address given the whole timeout would take 3 s; the post has 1 s in all.
        thread.join(2.5)
        assert not thread.is_alive() and result == [False]
    finally:
        for server, fillers in listeners:
            for filler in fillers:
                filler.close()
            server.close()


def test_a_tls_handshake_that_dribbles_is_bounded_by_the_post() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def dribble() -> None:
        client, _ = server.accept()
        with client:
            client.recv(65536)  # the ClientHello
            # A handshake record's header announcing 16 KiB, then a byte every 0.1 s: each
            # read waits less than any timeout.
            for byte in b"\x16\x03\x03\x40\x00" + b"\x00" * 16384:
                if stop.wait(0.1):
                    return
                try:
                    client.sendall(bytes([byte]))
                except OSError:
                    return

    server_thread = threading.Thread(target=dribble, daemon=True)
    server_thread.start()
    try:
        endpoint = Endpoint(f"https://127.0.0.1:{server.getsockname()[1]}/v1/traces", {})
        thread, result = in_thread(endpoint, 0.8)
        thread.join(8)  # generous: the bound is 0.8 s; unbounded, this takes half an hour
        assert not thread.is_alive() and result == [False]
    finally:
        stop.set()
        server_thread.join(5)
        server.close()

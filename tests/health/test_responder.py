"""The health process's connection handling, driven round by round in this process (a real
listening socket and real clients, the rounds in the order the kernel may report them)."""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from proxy.health import responder
from proxy.health.responder import MAX_CONNECTIONS, _Probes
from proxy.health.verdict import READY, readiness_byte


@pytest.fixture
def probes() -> Iterator[tuple[_Probes, socket.socket]]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    listener.setblocking(False)
    asks, theirs = os.pipe()
    os.set_blocking(theirs, False)
    server = _Probes(theirs, 10.0)
    server.selector.register(listener, selectors.EVENT_READ)
    server.hear(readiness_byte(READY))
    try:
        yield server, listener
    finally:
        listener.close()
        os.close(asks)
        os.close(theirs)


def connect(listener: socket.socket) -> socket.socket:
    return socket.create_connection(listener.getsockname(), timeout=2)


def round_with_listener_first(server: _Probes, listener: socket.socket) -> None:
    """One round as epoll may report it: the listener before the connections."""
    time.sleep(0.05)
    ready = server.selector.select(0)
    ready.sort(key=lambda event: event[0].fileobj is not listener)
    for key, _ in ready:
        if key.fileobj is listener:
            server.accept(listener)
        elif isinstance(key.fileobj, socket.socket):
            server.read(key.fileobj)


def test_a_connection_closed_to_make_room_is_not_read_again(
        probes: tuple[_Probes, socket.socket]) -> None:
    server, listener = probes
    clients = [connect(listener) for _ in range(MAX_CONNECTIONS)]
    for _ in range(10):  # a few accepts a round
        round_with_listener_first(server, listener)
    assert len(server.heads) == MAX_CONNECTIONS
    # The oldest sends its head in the same round a new connection makes it the one to go.
    newest = connect(listener)
    clients[0].sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    round_with_listener_first(server, listener)  # raised ValueError before
    assert clients[0].recv(100).startswith(b"HTTP/1.1 200 "), "its request had come"
    newest.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    round_with_listener_first(server, listener)
    assert newest.recv(100).startswith(b"HTTP/1.1 200 ")
    assert len(server.heads) <= MAX_CONNECTIONS
    for client in clients:
        client.close()


def test_at_most_so_many_connections_are_held_and_the_oldest_go(
        probes: tuple[_Probes, socket.socket]) -> None:
    server, listener = probes
    clients = [connect(listener) for _ in range(3 * MAX_CONNECTIONS)]
    for _ in range(20):
        round_with_listener_first(server, listener)
    assert len(server.heads) == MAX_CONNECTIONS
    closed = []
    for client in clients:
        client.settimeout(0.01)
        try:
            closed.append(client.recv(1) == b"")
        except TimeoutError:
            closed.append(False)
        except ConnectionResetError:
            closed.append(True)
    assert closed == [True] * (2 * MAX_CONNECTIONS) + [False] * MAX_CONNECTIONS
    for client in clients:
        client.close()


def read_to_end(client: socket.socket) -> bytes:
    got = b""
    while piece := client.recv(65536):
        got += piece
    return got


@pytest.mark.parametrize("behind", [
    b"GET /readyz HTTP/1.1\r\n\r\n" * 400,  # requests sent before the first's answer
    b"x" * 20_000,  # a body nobody asked for, more than one read takes
])
def test_bytes_sent_past_the_head_do_not_turn_the_answer_into_a_reset(
        probes: tuple[_Probes, socket.socket], behind: bytes) -> None:
    server, listener = probes
    client = connect(listener)
    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n" + behind)
    for _ in range(3):
        round_with_listener_first(server, listener)
    answer = read_to_end(client)  # a reset raised ConnectionResetError here before
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok\n"), answer
    assert not server.heads and not server.waiting
    client.close()


def test_bytes_that_come_after_the_answer_do_not_turn_it_into_a_reset(
        probes: tuple[_Probes, socket.socket]) -> None:
    server, listener = probes
    client = connect(listener)
    client.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    round_with_listener_first(server, listener)  # answered
    client.sendall(b"x" * 20_000)  # a body sent late: it meets the answered connection
    round_with_listener_first(server, listener)
    answer = read_to_end(client)  # a reset raised ConnectionResetError here before
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok\n"), answer
    client.close()
    round_with_listener_first(server, listener)
    assert not server.lingering  # its end came: closed


def test_an_answered_connection_the_client_keeps_open_is_closed_after_a_while(
        probes: tuple[_Probes, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    server, listener = probes
    monkeypatch.setattr(responder, "LINGER", 0.2)
    clients = [connect(listener) for _ in range(MAX_CONNECTIONS + 5)]
    for client in clients:
        client.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    for _ in range(12):
        round_with_listener_first(server, listener)
    # answered, each; held at most so many at once, the oldest let go first
    assert 0 < len(server.lingering) <= MAX_CONNECTIONS
    assert clients[-1].recv(100).startswith(b"HTTP/1.1 200 ")
    time.sleep(0.25)
    server.expire()
    assert not server.lingering and not server.heads
    for client in clients:
        client.close()

"""The export post over real sockets: a collector's answer split anywhere, chunked or with a
Content-Length, read to its end; too large, malformed or slow, a failed post (never an
exception); a kept-alive connection reused, and a new one when the collector closes after
each answer, said or not; the request framed as sent, gzipped, over TLS with a CA file."""

from __future__ import annotations

import gzip
import logging
import random
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.telemetry.exporting import Endpoint
from tests.e2e.rawhttp import read_request
from tests.telemetry.socket_collector import SocketCollector

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
BODY = b"\x0a\x04\x0a\x02\x08\x01"


class ScriptedCollector(SocketCollector):
    """Answers each request with the next script entry (the pieces sent apart, a pause
    between; OK when the script is done), then keeps the connection unless ``close``."""

    def __init__(self, script: list[list[bytes]], *, close: bool = False,
                 pause: float = 0.02, wrap: ssl.SSLContext | None = None) -> None:
        self.script, self.close_after, self.pause, self.wrap = script, close, pause, wrap
        self.requests: list[tuple[int, bytes, bytes]] = []  # (connection, head, body)
        super().__init__()

    def answer(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.settimeout(10)
        conn: socket.socket = client
        if self.wrap is not None:
            conn = self.wrap.wrap_socket(client, server_side=True)
        pending = b""
        while True:
            request = read_request(conn, pending)
            if request is None:
                return
            head, body, pending = request
            index = len(self.requests)
            self.requests.append((self.connections, head, body))
            pieces = self.script[index] if index < len(self.script) else [OK]
            for number, piece in enumerate(pieces):
                if number and self.stopped(self.pause):
                    return
                conn.sendall(piece)
            if self.close_after:
                return


@pytest.fixture
def collect() -> Iterator[list[ScriptedCollector]]:
    made: list[ScriptedCollector] = []
    yield made
    for collector in made:
        collector.close()


def scripted(made: list[ScriptedCollector], script: list[list[bytes]],
             **options: object) -> ScriptedCollector:
    made.append(ScriptedCollector(script, **options))  # type: ignore[arg-type]
    return made[-1]


def splits(raw: bytes) -> list[list[bytes]]:
    """``raw`` cut in two at several places, in three, and a few bytes at a time."""
    cuts = [[raw[:i], raw[i:]] for i in (1, 9, 16, len(raw) // 2, len(raw) - 1)]
    cuts.append([raw[:12], raw[12:30], raw[30:]])
    cuts.append([raw[i:i + 7] for i in range(0, len(raw), 7)])
    return cuts


LENGTH = (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
          b"Content-Length: 4\r\n\r\n\x12\x02ok")
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"2;x=y\r\n\x12\x02\r\n2\r\nok\r\n0\r\nX-Trailer: 1\r\n\r\n")


@pytest.mark.parametrize("raw", [LENGTH, CHUNKED], ids=["content-length", "chunked"])
def test_answers_split_anywhere_are_read_whole_on_one_kept_alive_connection(
        collect: list[ScriptedCollector], raw: bytes) -> None:
    script = splits(raw)
    collector = scripted(collect, script)
    endpoint = Endpoint(collector.url, {})
    try:
        for n in range(len(script) + 2):
            assert endpoint.post(BODY + bytes([n]), timeout=5.0), n
    finally:
        endpoint.end()
    assert collector.connections == 1  # each answer ended where it ends: the next one read
    assert [body for _, _, body in collector.requests] == \
        [BODY + bytes([n]) for n in range(len(script) + 2)]


@pytest.mark.parametrize("said", [True, False], ids=["connection-close", "silent"])
def test_a_collector_closing_after_each_answer_gets_each_post_on_a_new_connection(
        collect: list[ScriptedCollector], said: bool) -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n" if said \
        else OK  # silent: it says nothing, and closes once idle
    collector = scripted(collect, [[answer]] * 4, close=True)
    endpoint = Endpoint(collector.url, {})
    try:
        for _ in range(4):
            assert endpoint.post(BODY, timeout=5.0)
            time.sleep(0.05)  # the collector's close arrives
    finally:
        endpoint.end()
    assert collector.connections == 4
    assert [connection for connection, _, _ in collector.requests] == [1, 2, 3, 4]


def test_an_answer_without_a_length_is_read_to_the_close(
        collect: list[ScriptedCollector]) -> None:
    collector = scripted(collect, [[b"HTTP/1.0 200 OK\r\n\r\n", b"\x12\x02", b"ok"]] * 2,
                         close=True)
    endpoint = Endpoint(collector.url, {})
    try:
        assert endpoint.post(BODY, timeout=5.0)
        assert endpoint.post(BODY, timeout=5.0)
    finally:
        endpoint.end()
    assert collector.connections == 2


BAD = {
    "too large, said": [b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n",
                        b"x" * 65536],
    "too large, chunked": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
    + [b"4000\r\n" + b"x" * 0x4000 + b"\r\n"] * 20,
    "too large, to the close": [b"HTTP/1.1 200 OK\r\n\r\n"] + [b"x" * 65536] * 4,
    "endless head": [b"HTTP/1.1 200 OK\r\n"] + [b"X-Pad: " + b"a" * 4000 + b"\r\n"] * 10,
    "not http": [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"],
    "bad status": [b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n"],
    "bad length": [b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"],
    "bad chunk": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"zz\r\n"],
    "cut short": [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
}


@pytest.mark.parametrize("name", BAD)
def test_an_answer_too_large_or_malformed_fails_the_post_and_the_next_one_reconnects(
        collect: list[ScriptedCollector], name: str) -> None:
    collector = scripted(collect, [BAD[name]], pause=0.0, close=name == "cut short")
    endpoint = Endpoint(collector.url, {})
    try:
        began = time.monotonic()
        assert endpoint.post(BODY, timeout=5.0) is False
        assert time.monotonic() - began < 4.0  # refused as it came, not timed out
        assert endpoint.post(BODY, timeout=5.0)
    finally:
        endpoint.end()
    assert collector.connections == 2


def test_an_answer_that_stalls_mid_body_is_bounded_by_the_post(
        collect: list[ScriptedCollector]) -> None:
    collector = scripted(collect, [[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab",
                                    b"cdefghij"]], pause=30.0)
    endpoint = Endpoint(collector.url, {})
    try:
        began = time.monotonic()
        assert endpoint.post(BODY, timeout=0.5) is False
        assert time.monotonic() - began < 3.0  # generous: the bound is 0.5 s
    finally:
        endpoint.end()


def test_the_request_is_framed_as_sent_and_gzipped_when_asked(
        collect: list[ScriptedCollector]) -> None:
    collector = scripted(collect, [])
    plain = Endpoint(collector.url, {"x-collector-key": "k1"})
    zipped = Endpoint(collector.url, {"x-collector-key": "k1"}, compress=True)
    body = bytes(range(256)) * 40
    try:
        assert plain.post(body, timeout=5.0)
        plain.end()  # the collector takes one connection at a time
        assert zipped.post(body, timeout=5.0)
    finally:
        plain.end()
        zipped.end()
    (_, head, sent), (_, zipped_head, zipped_sent) = collector.requests
    lines = head.split(b"\r\n")
    port = collector.url.split(":")[2].split("/")[0]
    assert lines[0] == b"POST /v1/traces HTTP/1.1"
    fields = {name.lower(): value.strip() for name, _, value in
              (line.partition(b":") for line in lines[1:])}
    assert fields[b"host"] == b"127.0.0.1:" + port.encode()
    assert fields[b"content-type"] == b"application/x-protobuf"
    assert fields[b"x-collector-key"] == b"k1"
    assert fields[b"content-length"] == str(len(body)).encode()
    assert b"content-encoding" not in fields and sent == body
    assert b"Content-Encoding: gzip" in zipped_head.split(b"\r\n")
    assert gzip.decompress(zipped_sent) == body


def test_a_request_larger_than_the_sockets_buffer_arrives_whole(
        collect: list[ScriptedCollector]) -> None:
    collector = scripted(collect, [], pause=0.0)
    endpoint = Endpoint(collector.url, {})
    body = random.Random(7).randbytes(4 * 1024 * 1024)  # a request's most
    try:
        assert endpoint.post(body, timeout=10.0)
        assert endpoint.post(BODY, timeout=5.0)
    finally:
        endpoint.end()
    assert [sent for _, _, sent in collector.requests] == [body, BODY]
    assert collector.connections == 1


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    directory = tmp_path_factory.mktemp("otlp-tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


def test_tls_with_a_ca_file_keeps_its_connection_and_an_unknown_ca_fails(
        collect: list[ScriptedCollector], certificate: tuple[Path, ssl.SSLContext]) -> None:
    cert, context = certificate
    collector = scripted(collect, [[CHUNKED[:20], CHUNKED[20:]]], wrap=context)
    url = collector.url.replace("http://", "https://")
    trusted = Endpoint(url, {}, certificate=str(cert))
    untrusted = Endpoint(url.replace("127.0.0.1", "localhost"), {})
    try:
        for _ in range(3):
            assert trusted.post(BODY, timeout=5.0)
        assert collector.connections == 1
        trusted.end()
        assert untrusted.post(BODY, timeout=5.0) is False
    finally:
        trusted.end()
        untrusted.end()
    assert [body for _, _, body in collector.requests] == [BODY] * 3


def test_a_collector_resetting_the_connection_mid_answer_fails_the_post_without_raising(
        ) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def reset() -> None:
        while not stop.is_set():
            server.settimeout(0.2)
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            client.recv(65536)
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00"
                              b"\x00\x00")
            client.close()

    thread = threading.Thread(target=reset, daemon=True)
    thread.start()
    endpoint = Endpoint(f"http://127.0.0.1:{server.getsockname()[1]}/v1/traces", {})
    try:
        assert endpoint.post(BODY, timeout=5.0) is False
        assert endpoint.post(BODY, timeout=5.0) is False
    finally:
        endpoint.end()
        stop.set()
        thread.join(5)
        server.close()


def test_an_endpoint_whose_head_cannot_be_made_says_so_and_never_connects(
        collect: list[ScriptedCollector], caplog: pytest.LogCaptureFixture) -> None:
    collector = scripted(collect, [])
    with caplog.at_level(logging.WARNING, "tailfloor.telemetry"):
        endpoint = Endpoint(collector.url, {"x-key": "s3cret\r\nX-Injected: 1"})
    assert endpoint.post(BODY, timeout=1.0) is False
    assert "cannot be made" in caplog.text and "s3cret" not in caplog.text
    assert collector.connections == 0

"""Bad input and upstream faults: each gets its documented answer and is counted."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from tests.conftest import ProxyProcess, free_port
from tests.fake_upstream import FakeUpstream, Reply

CHAT = b'{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}'
STREAM_CHAT = b'{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def post(url: str, body: bytes, timeout: float = 10) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-sEcReT-999"}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def error_of(body: bytes) -> dict[str, object]:
    parsed = orjson.loads(body)
    assert set(parsed["error"]) >= {"message", "type", "code"}
    error: dict[str, object] = parsed["error"]
    return error


@pytest.fixture(scope="module")
def small_proxy(fake: FakeUpstream) -> Iterator[ProxyProcess]:
    process = ProxyProcess(fake.url, "--max-body-bytes", "1000", "--read-timeout", "0.5",
                           "--keepalive-interval", "0.15", "--access-log")
    yield process
    process.stop()


def test_invalid_json_is_400_and_never_reaches_upstream(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = small_proxy.sample("tailfloor_rejected_requests_total", reason="invalid_json")
    for body in (b"{not json", b"[1,2]"):
        status, answer = post(small_proxy.url + "/v1/chat/completions", body)
        assert status == 400
        assert error_of(answer)["code"] == "invalid_json"
    assert clean_fake.received == []
    after = small_proxy.sample("tailfloor_rejected_requests_total", reason="invalid_json")
    assert after == before + 2


def test_oversized_body_is_413_for_chat_and_passthrough(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    big = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 2000 + b'"}]}'
    for path in ("/v1/chat/completions", "/v1/embeddings"):
        status, answer = post(small_proxy.url + path, big)
        assert status == 413
        assert error_of(answer)["code"] == "request_too_large"
    assert clean_fake.received == []
    assert small_proxy.sample("tailfloor_rejected_requests_total", reason="too_large") >= 2


def test_chunked_upload_growing_past_the_limit_is_413(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = small_proxy.sample("tailfloor_rejected_requests_total", reason="too_large")
    connection = http.client.HTTPConnection("127.0.0.1", small_proxy.port, timeout=10)
    connection.request("POST", "/v1/files", body=(b"x" * 400 for _ in range(5)),
                       encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    response = connection.getresponse()
    assert response.status == 413
    assert error_of(response.read())["code"] == "request_too_large"
    connection.close()
    assert small_proxy.sample("tailfloor_rejected_requests_total",
                              reason="too_large") == before + 1
    assert not any(r.completed for r in clean_fake.received)
    # Under the limit, the same kind of upload goes through whole.
    connection = http.client.HTTPConnection("127.0.0.1", small_proxy.port, timeout=10)
    connection.request("POST", "/v1/files", body=(b"y" * 300 for _ in range(3)),
                       encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    response = connection.getresponse()
    assert response.status == 200
    assert orjson.loads(response.read())["echo"] == "y" * 900
    connection.close()


def test_upstream_refusing_connections_gives_502() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    process = ProxyProcess(dead)
    try:
        for body in (CHAT, STREAM_CHAT):
            status, answer = post(process.url + "/v1/chat/completions", body)
            assert status == 502
            assert error_of(answer)["code"] == "upstream_unavailable"
        status, _ = post(process.url + "/v1/embeddings", b"{}")
        assert status == 502
        assert process.sample("tailfloor_upstream_errors_total", kind="connect") == 3
        assert process.sample("tailfloor_requests_total", route="chat_completions",
                              code="502") == 2
    finally:
        process.stop()


def test_slow_upstream_gives_504(small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    clean_fake.script.append(Reply(delay_before_headers=2.0))
    status, answer = post(small_proxy.url + "/v1/chat/completions", CHAT)
    assert status == 504
    assert error_of(answer)["code"] == "upstream_timeout"
    assert small_proxy.sample("tailfloor_upstream_errors_total", kind="timeout") >= 1


def test_upstream_closing_mid_stream_ends_the_stream_with_an_error_event(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = small_proxy.sample("tailfloor_upstream_errors_total", kind="mid_stream")
    clean_fake.script.append(Reply(close_after_chunks=2))
    status, answer = post(small_proxy.url + "/v1/chat/completions", STREAM_CHAT)
    assert status == 200
    events = [e for e in answer.split(b"\n\n") if e]
    assert len(events) == 3
    last = orjson.loads(events[-1][6:])
    assert last["error"]["code"] == "upstream_mid_stream"
    assert b"[DONE]" not in answer
    after = small_proxy.sample("tailfloor_upstream_errors_total", kind="mid_stream")
    assert after == before + 1


def test_silent_stream_times_out_between_chunks(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    def counted() -> tuple[float, float]:
        name = "tailfloor_upstream_errors_total"
        return (small_proxy.sample(name, kind="mid_stream"),
                small_proxy.sample(name, kind="timeout"))

    broken, timeouts = counted()
    clean_fake.script.append(Reply(delay_between_chunks=1.0))
    status, answer = post(small_proxy.url + "/v1/chat/completions", STREAM_CHAT)
    assert status == 200
    assert b'"code":"upstream_timeout"' in answer
    # A stream broken after its head, as the alert on broken streams counts it; "timeout"
    # is for answers that never began (a 504, counted among the 5xx already).
    assert counted() == (broken + 1, timeouts)


def test_an_error_event_of_the_upstream_is_counted(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = small_proxy.sample("tailfloor_upstream_errors_total", kind="error_event")
    clean_fake.script.append(Reply(stream_error={"message": "boom", "code": "server_error"}))
    status, answer = post(small_proxy.url + "/v1/responses",
                          b'{"model":"fake-model","stream":true,"input":"hi"}')
    assert status == 200 and b"response.failed" in answer
    clean_fake.script.append(Reply())  # a whole stream: not counted
    status, answer = post(small_proxy.url + "/v1/responses",
                          b'{"model":"fake-model","stream":true,"input":"hi"}')
    assert status == 200 and b"response.completed" in answer
    after = small_proxy.sample("tailfloor_upstream_errors_total", kind="error_event")
    assert after == before + 1


def test_idle_stream_gets_keepalive_comments_between_events(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url, "--keepalive-interval", "0.1", "--read-timeout", "5")
    try:
        clean_fake.script.append(Reply(delay_between_chunks=0.35, text="abcdef", pieces=2))
        status, answer = post(process.url + "/v1/chat/completions", STREAM_CHAT)
        assert status == 200
        assert answer.count(b": keep-alive\n\n") >= 3
        # Every keep-alive stands between two whole events.
        for part in answer.split(b"\n\n"):
            assert part == b"" or part.startswith((b"data: ", b": keep-alive"))
        assert process.sample("tailfloor_stream_keepalives_total") >= 3
    finally:
        process.stop()


def test_a_stream_idle_before_its_first_event_gets_its_head_and_keepalives_at_once(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    """The head waits for the first event (one write); an upstream that is silent after its
    own head gets the client the head and keep-alive comments meanwhile, then the events."""
    process = ProxyProcess(fake.url, "--keepalive-interval", "0.1", "--read-timeout", "5")
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"late"}}]}\n\n',
              b"data: [DONE]\n\n"]
    try:
        # The empty first piece writes nothing: the first event comes 0.45 s after the head.
        clean_fake.script.append(Reply(chunks=[b"", *events], delay_between_chunks=0.45))
        status, answer = post(process.url + "/v1/chat/completions", STREAM_CHAT)
        assert status == 200
        before, _, after = answer.partition(events[0])
        assert before.count(b": keep-alive\n\n") >= 2 and before.replace(
            b": keep-alive\n\n", b"") == b""
        assert after.replace(b": keep-alive\n\n", b"") == events[1]
        assert process.sample("tailfloor_stream_keepalives_total") >= 2
    finally:
        process.stop()


def test_client_disconnect_cancels_the_upstream_request(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = proxy.sample("tailfloor_client_disconnects_total")
    clean_fake.script.append(Reply(delay_between_chunks=0.3, text="x" * 40, pieces=20))
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    connection.request("POST", "/v1/chat/completions", body=STREAM_CHAT,
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    response.read1(100)
    connection.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
    connection.close()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not clean_fake.chat_requests()[-1].disconnected:
        time.sleep(0.02)
    received = clean_fake.chat_requests()[-1]
    assert received.disconnected and not received.completed
    assert time.monotonic() < deadline
    deadline = time.monotonic() + 3
    while proxy.sample("tailfloor_client_disconnects_total") < before + 1:
        assert time.monotonic() < deadline, "disconnect not counted"
        time.sleep(0.05)


def test_client_leaving_between_events_is_a_499_not_a_500(
        proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    before = proxy.sample("tailfloor_client_disconnects_total")
    errors_before = proxy.sample("tailfloor_requests_total", route="chat_completions", code="500")
    for _ in range(3):
        clean_fake.script.append(Reply(delay_between_chunks=0.2, text="y" * 30, pieces=10))
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(STREAM_CHAT) + STREAM_CHAT)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 5
    while proxy.sample("tailfloor_client_disconnects_total") < before + 3:
        assert time.monotonic() < deadline, "disconnects not counted"
        time.sleep(0.05)
    assert proxy.sample("tailfloor_requests_total", route="chat_completions",
                        code="499") >= 3
    assert proxy.sample("tailfloor_requests_total", route="chat_completions",
                        code="500") == errors_before


def test_clients_leaving_early_are_counted_without_error_logs(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url)
    try:
        for index in range(20):
            # Half leave before any byte came back, half after the first event while the
            # upstream keeps sending: a write, not a cancellation, then finds them gone.
            clean_fake.script.append(Reply(delay_before_headers=0.03) if index % 2 else
                                     Reply(text="z" * 400, pieces=100, delay_between_chunks=0.005))
        for index in range(20):
            with socket.create_connection(("127.0.0.1", process.port), timeout=5) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(STREAM_CHAT) + STREAM_CHAT)
                if index % 2 == 0:
                    sock.recv(100)
        # The ten that left mid-stream are always noticed; the others only when tailfloor
        # still had something to write after they closed.
        deadline = time.monotonic() + 5
        while process.sample("tailfloor_client_disconnects_total") < 10:
            assert time.monotonic() < deadline, "disconnects not counted"
            time.sleep(0.05)
        # Every request is over (a request is counted last, after anything it logged).
        while process.sample("tailfloor_requests_total", route="chat_completions") < 20:
            assert time.monotonic() < deadline, "not every request ended"
            time.sleep(0.05)
        errors = [line for line in process.logs().splitlines() if '"level":"error"' in line]
        assert errors == []
        # A client that left is not the upstream failing: no upstream error, no warning.
        assert process.sample("tailfloor_upstream_errors_total") == 0
        assert process.sample("tailfloor_requests_total", code="500") == 0
        assert process.sample("tailfloor_requests_total", code="499") == process.sample(
            "tailfloor_client_disconnects_total")
    finally:
        process.stop()


def test_upstream_rejecting_stream_options_is_retried_without_and_remembered(
        fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    process = ProxyProcess(fake.url)
    try:
        clean_fake.reject_stream_options = True
        for _ in range(2):
            status, answer = post(process.url + "/v1/chat/completions", STREAM_CHAT)
            assert status == 200 and answer.endswith(b"data: [DONE]\n\n")
        bodies = [orjson.loads(r.body) for r in clean_fake.chat_requests()]
        assert ["stream_options" in b for b in bodies] == [True, False, False]
        assert process.sample("tailfloor_upstream_errors_total",
                              kind="stream_options_rejected") == 1
    finally:
        process.stop()


def test_logs_carry_request_ids_and_never_the_api_key(
        small_proxy: ProxyProcess, clean_fake: FakeUpstream) -> None:
    clean_fake.script.append(Reply(delay_before_headers=2.0))
    post(small_proxy.url + "/v1/chat/completions", CHAT)
    logs = small_proxy.logs()
    assert "sk-sEcReT-999" not in logs
    lines = [orjson.loads(line) for line in logs.splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line["level"] == "warning"]
    assert warnings and all(line["request_id"] != "-" for line in warnings)
    access = [line for line in lines if line["logger"] == "tailfloor.access"]
    assert access and all(line["request_id"] != "-" and "status" in line for line in access)
    assert {line["status"] for line in access} >= {504}


def test_a_client_gone_mid_answer_closes_the_upstream_connection() -> None:
    """A non-streaming answer the client stops waiting for: the upstream socket is closed
    (not pooled, not left open until the upstream's own idle timeout)."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    closed_after: list[float] = []
    answering = threading.Event()

    def upstream() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n0123456789")
        answering.set()
        started = time.monotonic()
        try:
            while conn.recv(65536):
                pass
            closed_after.append(time.monotonic() - started)
        except OSError:
            pass
        conn.close()

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    process = ProxyProcess(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with socket.create_connection(("127.0.0.1", process.port), timeout=5) as client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                           b"Content-Type: application/json\r\nContent-Length: "
                           + str(len(CHAT)).encode() + b"\r\n\r\n" + CHAT)
            assert answering.wait(5), "the request never reached the upstream"
        # A pooled or forgotten socket would stay open past the upstream's 10 s read: the
        # proxy closed it within the join's bound.
        thread.join(5)
        assert closed_after, "the upstream connection was left open"
    finally:
        process.stop()
        listener.close()

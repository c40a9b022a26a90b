"""``--health-listen``: probes answered by a process of its own, from what a real
``tailfloor serve``'s event loop answers it, whatever that loop is doing (stopped by SIGSTOP
here: the strongest form of a loop held by a huge parse or the first scan)."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.procs import children_map
from tests.conftest import ProxyProcess, free_port
from tests.fake_upstream import FakeUpstream, Reply
from tests.streaming import stream_in_background

STALE_AFTER = 1.0


def probe(port: int, path: str = "/healthz", method: str = "GET",
          timeout: float = 5.0) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def responder_pids(parent: int) -> list[int]:
    """The health processes among ``parent``'s children (from /proc, not from tailfloor)."""
    found = []
    for child in children_map().get(parent, ()):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"proxy.health.responder" in command:
            found.append(child)
    return found


def wait_for(check: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def served(fake: FakeUpstream) -> Iterator[tuple[ProxyProcess, int]]:
    port = free_port()
    process = ProxyProcess(fake.url, "--health-listen", f"127.0.0.1:{port}",
                           "--health-stale-after", str(STALE_AFTER))
    try:
        yield process, port
    finally:
        os.kill(process.proc.pid, signal.SIGCONT)
        process.stop()


def test_probes_answer_from_a_process_of_their_own(served: tuple[ProxyProcess, int]) -> None:
    process, port = served
    assert probe(port) == (200, "ok\n")
    wait_for(lambda: probe(port, "/readyz") == (200, "ready\n"), 5, "never ready")
    assert probe(port, method="HEAD")[0] == 200
    assert probe(port, "/metrics")[0] == 404
    assert probe(port, "/healthz", method="POST")[0] == 405
    children = responder_pids(process.proc.pid)
    assert len(children) == 1, children
    # The proxy's own listeners still answer the probes as before.
    assert probe(process.port) == (200, "ok\n")
    assert probe(process.admin_port, "/readyz") == (200, "ready\n")


def test_a_stopped_event_loop_is_reported_not_live(served: tuple[ProxyProcess, int]) -> None:
    process, port = served
    assert probe(port) == (200, "ok\n")  # the loop has answered once
    os.kill(process.proc.pid, signal.SIGSTOP)
    try:
        # Answered at once while the loop cannot answer anything: first still live (its
        # question was just asked), then not live once it has waited longer than
        # --health-stale-after.
        with pytest.raises(OSError):
            probe(process.admin_port, timeout=0.5)
        assert probe(port, timeout=1.0) == (200, "ok\n")
        wait_for(lambda: probe(port, timeout=1.0)[0] == 503, 10 * STALE_AFTER,
                 "a stopped loop still reported live")
        status, text = probe(port, "/readyz", timeout=3.0)
        assert status == 503 and text.startswith("not live: the event loop has not answered"), \
            text
    finally:
        os.kill(process.proc.pid, signal.SIGCONT)
    wait_for(lambda: probe(port) == (200, "ok\n"), 5, "not live again after SIGCONT")


def test_the_health_process_ends_with_the_proxy(fake: FakeUpstream) -> None:
    for sig in (signal.SIGKILL, signal.SIGTERM):
        port = free_port()
        process = ProxyProcess(fake.url, "--health-listen", f"127.0.0.1:{port}")
        try:
            [child] = responder_pids(process.proc.pid)
            process.proc.send_signal(sig)
            process.proc.wait(10)
            wait_for(lambda c=child: not Path(f"/proc/{c}").exists()  # type: ignore[misc]
                     or "Z" in Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1][:3],
                     5, f"the health process outlived the proxy ({sig.name})")
            with pytest.raises(OSError):
                probe(port, timeout=1.0)
        finally:
            process.stop()


def test_a_dead_health_process_is_started_again(served: tuple[ProxyProcess, int]) -> None:
    process, port = served
    [first] = responder_pids(process.proc.pid)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: [p for p in responder_pids(process.proc.pid) if p != first], 15,
             "no new health process")
    assert probe(port) == (200, "ok\n")
    assert "the health process" in process.logs()


def test_draining_is_live_and_not_ready(fake: FakeUpstream, clean_fake: FakeUpstream) -> None:
    port = free_port()
    process = ProxyProcess(fake.url, "--health-listen", f"127.0.0.1:{port}",
                           "--shutdown-grace", "5")
    clean_fake.script.append(Reply(delay_between_chunks=0.5, text="abcdefgh", pieces=4))
    try:
        assert probe(port, "/readyz") == (200, "ready\n")
        worker, result = stream_in_background(process.port)
        time.sleep(0.3)
        process.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert process.proc.poll() is None, "the stream keeps the drain going"
        assert probe(port, "/readyz") == (503, "not ready\n")
        assert probe(port) == (200, "ok\n")
        worker.join(10)
        assert process.proc.wait(10) == 0
        assert result["body"].endswith(b"data: [DONE]\n\n")
    finally:
        process.stop()


def test_idle_and_slow_connections_cannot_keep_a_probe_out(
        served: tuple[ProxyProcess, int]) -> None:
    _, port = served
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(150)]
    try:
        for sock in idle[-20:]:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        assert probe(port, timeout=2.0) == (200, "ok\n")
        huge = socket.create_connection(("127.0.0.1", port), timeout=5)
        huge.sendall(b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n")
        assert huge.recv(100).startswith(b"HTTP/1.1 431 ")
        huge.close()
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        began = time.monotonic()
        assert silent.recv(100).startswith(b"HTTP/1.1 408 ")  # closed after its deadline
        assert time.monotonic() - began < 4.5
        silent.close()
        junk = socket.create_connection(("127.0.0.1", port), timeout=5)
        junk.sendall(b"\x16\x03\x01 not http\r\n\r\n")
        assert junk.recv(100).startswith(b"HTTP/1.1 400 ")
        junk.close()
    finally:
        for sock in idle:
            sock.close()
    assert probe(port) == (200, "ok\n")


def test_a_flood_of_connections_does_not_push_out_a_probe_that_has_asked(
        served: tuple[ProxyProcess, int]) -> None:
    process, port = served
    assert probe(port) == (200, "ok\n")
    [child] = responder_pids(process.proc.pid)
    os.kill(child, signal.SIGSTOP)  # so the probe and the flood wait in the backlog together
    try:
        asking = socket.create_connection(("127.0.0.1", port), timeout=5)
        asking.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        flood = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
    finally:
        os.kill(child, signal.SIGCONT)
    try:
        assert asking.recv(100).startswith(b"HTTP/1.1 200 ")
    finally:
        asking.close()
        for sock in flood:
            sock.close()


def test_the_health_process_sleeps_while_nobody_probes(
        served: tuple[ProxyProcess, int]) -> None:
    process, port = served
    assert probe(port) == (200, "ok\n")
    [child] = responder_pids(process.proc.pid)

    def switches() -> int:  # each time it slept and woke
        for line in Path(f"/proc/{child}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
        raise AssertionError("no voluntary_ctxt_switches")

    time.sleep(0.5)
    before = switches()
    time.sleep(2.0)
    assert switches() == before


def test_a_taken_health_port_fails_the_start_naming_the_flag(fake: FakeUpstream) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as failed:
            ProxyProcess(fake.url, "--health-listen", f"127.0.0.1:{port}")
    assert "--health-listen" in str(failed.value)

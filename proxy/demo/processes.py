"""Child processes and plain HTTP for the demo (a command-line program: blocking calls are
fine here, nothing else runs on this thread)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Process", "free_port", "http", "metrics", "stop_process", "wait_until_ready"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """A child process whose output goes to a log file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)

    def wait_ready(self, url: str, *, seconds: float) -> None:
        wait_until_ready(self.proc, url, self.tail, self.log.stem, seconds=seconds, pause=0.1)

    def tail(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.proc)
        self._out.close()


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (tailfloor drains), then SIGKILL if it is still there after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until_ready(proc: subprocess.Popen[bytes], url: str, logs: Callable[[], str],
                     name: str, *, seconds: float, pause: float) -> None:
    """Until ``url`` answers 200; RuntimeError with the process's log if it exits or never
    does."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{logs()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(pause)
    raise RuntimeError(f"{name} did not become ready:\n{logs()}")


def http(url: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """POST a JSON body; the status, headers (lower-cased names) and body, errors included."""
    request = urllib.request.Request(url, data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return (response.status, {k.lower(): v for k, v in response.headers.items()},
                    response.read())
    except urllib.error.HTTPError as error:
        return (error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, by name and sorted labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}

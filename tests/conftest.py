"""Shared fixtures: the scripted fake upstream (in a background thread) and real tailfloor
server processes started with ``python -m proxy serve``."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.demo.processes import stop_process, wait_until_ready
from tests.evidence import Evidence
from tests.fake_upstream import FakeUpstream

ROOT = Path(__file__).resolve().parent.parent


class ThreadedFake:
    """A FakeUpstream running on its own event loop in a daemon thread."""

    def __init__(self) -> None:
        self.fake = FakeUpstream()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ProxyProcess:
    """A real ``tailfloor serve`` process on a free loopback port."""

    def __init__(self, upstream: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_port = free_port()
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        work = Path(tempfile.mkdtemp(prefix="tailfloor-test-"))
        self.log_path = work / "proxy.log"
        if "--sessions" not in extra:
            # Never the real ~/.openclaw or ~/.pi of whoever runs the tests.
            (work / "no-sessions").mkdir()
            extra = (*extra, "--sessions", str(work / "no-sessions"))
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--admin-listen", f"127.0.0.1:{self.admin_port}",
             "--upstream", upstream, "--log-format", "json",
             # the reasons too: tests read why a request passed through
             "--tailfloor-header", "detailed", *extra],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        self._wait_ready()

    def _wait_ready(self) -> None:
        wait_until_ready(self.proc, self.url + "/readyz", self.logs, "tailfloor", seconds=20,
                         pause=0.05)

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def sample(self, name: str, *, settled: bool = True, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``: 0 when none of its
        series has those labels yet, an AssertionError when the process exports no metric of
        that name at all (a renamed or removed metric must not read as a zero). ``settled``:
        read once no request is in flight (a client can have all of a stream a moment
        before the proxy has recorded its end)."""
        return sample_of(settled_metrics(self) if settled else self.metrics_text(), name,
                         **labels)

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


def settled_metrics(proxy: Any, bound: float = 10.0) -> str:
    """The proxy's exposition once it has no request in flight (every request recorded)."""
    deadline = time.monotonic() + bound
    while True:
        text = proxy.metrics_text()
        if sample_of(text, "tailfloor_in_flight_requests") == 0:
            return text
        assert time.monotonic() < deadline, f"requests still in flight after {bound} s"
        time.sleep(0.005)


def sample_of(text: str, name: str, **labels: str) -> float:
    """``ProxyProcess.sample`` over an exposition ``text``."""
    total, known = 0.0, False
    for family in text_string_to_metric_families(text):
        # A counter's family is named without _total; histograms add _bucket/_sum/_count.
        if name == family.name or name.startswith(family.name + "_"):
            known = known or name in _series_names(family.name, family.type)
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                total += sample.value
    assert known, f"the process exports no metric {name!r}"
    return total


def wait_for_sample(proxy: Any, name: str, want: float, bound: float = 10.0,
                    **labels: str) -> float:
    """``proxy.sample(name, **labels)`` once it reaches ``want`` (a stream's client can have
    the whole answer a moment before the proxy has recorded the end of it); fails after
    ``bound`` seconds saying what it awaited."""
    deadline = time.monotonic() + bound
    while (value := proxy.sample(name, **labels)) < want:
        assert time.monotonic() < deadline, \
            f"{name}{labels} stayed at {value}, awaited {want} for {bound} s"
        time.sleep(0.01)
    return value


def registry_sample(registry: Any, name: str, **labels: str) -> float:
    """``sample_of`` over an in-process registry (prometheus_client's ``get_sample_value``
    says None alike for a metric that does not exist and a series not yet counted)."""
    return sample_of(generate_latest(registry).decode(), name, **labels)


def _series_names(family: str, kind: str) -> set[str]:
    if kind == "counter":
        return {family + "_total", family + "_created"}
    if kind in ("histogram", "summary"):
        return {family + s for s in ("_bucket", "_sum", "_count", "_created", "")}
    return {family}


@pytest.fixture
def evidence(request: pytest.FixtureRequest) -> Evidence:
    """Sources a live test registers; written out and summarised only when it fails."""
    return Evidence(request.node.nodeid)


# Directories whose files drive real agents, the real model or real containers: up to
# minutes a file. CI runs files on two workers, one file at a time each (--dist loadfile,
# --no-loadscope-reorder); these go first, the files of one long scenario before the rest,
# so the two workers end together instead of one running a six-minute file alone at the
# end (xdist's own order, files with the most tests first, put exactly those last).
_LONG_DIRECTORIES = ("agents", "model", "deploy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_in = Counter(item.path for item in items)

    def rank(item: pytest.Item) -> tuple[int, int]:
        if item.path.parent.name in _LONG_DIRECTORIES:
            return 0, tests_in[item.path]
        return 1, 0

    items.sort(key=rank)  # stable: a file's tests stay together, in their own order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    found = getattr(item, "funcargs", {}).get("evidence")
    if report.failed and isinstance(found, Evidence) and found.sources:
        _, lines = found.write()
        report.sections.append(("evidence", "\n".join(lines)))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    threaded = ThreadedFake()
    yield threaded.fake
    threaded.stop()


@pytest.fixture(autouse=False)
def clean_fake(fake: FakeUpstream) -> FakeUpstream:
    fake.reset()
    return fake


@pytest.fixture(scope="module")
def proxy(fake: FakeUpstream) -> Iterator[ProxyProcess]:
    """tailfloor built in-process in front of the module's fake (tests/inprocess.py)."""
    from tests.inprocess import InProcessProxy  # it imports this module

    built = InProcessProxy(fake)
    yield built  # type: ignore[misc]  # ProxyProcess's interface
    built.stop()

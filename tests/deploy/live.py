"""Running pieces for the live deployment tests: the fake upstream, a real ``tailfloor serve``
process, a real Prometheus, a short mixed load, and reading the exposition."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import fake_upstream
from tests.conftest import stop_process
from tests.deploy.feature_load import FeatureLoad
from tests.deploy.tools import ROOT, find_tool

MIN_ROUNDS = 4
ROUND_SECONDS = 1.3
# Longer than the 1 s scrape interval: Prometheus scrapes between two rounds, so a counter
# that one step creates and the next round's same step raises has a rate above zero.
ROUND_PAUSE = 1.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def wait_for(check: Callable[[], bool], timeout: float, what: str,
             logs: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{logs()}", pytrace=False)


class FakeUpstream:
    """The project's scripted fake upstream on a loopback port, on its own event loop in a
    daemon thread. ``push`` queues a scripted reply for the next chat request."""

    def __init__(self) -> None:
        self.fake = fake_upstream.FakeUpstream()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self._loop).result(10)
        self.url = self.fake.url

    def push(self, reply: fake_upstream.Reply) -> None:
        self._loop.call_soon_threadsafe(self.fake.script.append, reply)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class Process:
    """A child process whose output goes to a log file the failure message can quote."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, cwd=ROOT)

    def logs(self) -> str:
        self._out.flush()
        return f"--- {self.log.name} ---\n" + self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_process(self.proc)
        self._out.close()


def start_tailfloor(upstream: str, tmp: Path, rules: Path | None = None,
                    args: Sequence[str] = ()) -> tuple[Process, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ["--rules", str(rules)] if rules is not None else []
    extra += args
    process = Process(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{free_port()}",
         "--upstream", upstream, "--log-format", "json", *extra],
        tmp / "tailfloor.log", env={"PYTHONPATH": str(ROOT)})

    def ready() -> bool:
        if process.proc.poll() is not None:
            pytest.fail(f"tailfloor exited early\n{process.logs()}", pytrace=False)
        return http_get(url + "/readyz", timeout=1) is not None

    wait_for(ready, 30, "tailfloor /readyz", process.logs)
    return process, url


def start_prometheus(target: str, tmp: Path, interval: str = "1s") -> tuple[Process, str]:
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": "tailfloor", "scrape_interval": interval,
                            "static_configs": [{"targets": [target]}]}]}))
    process = Process(
        [find_tool("prometheus"), f"--config.file={config}",
         f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         "--storage.tsdb.retention.time=1h", "--log.level=warn"],
        tmp / "prometheus.log")
    url = f"http://127.0.0.1:{port}"

    def scraped() -> bool:
        if process.proc.poll() is not None:
            pytest.fail(f"prometheus exited early\n{process.logs()}", pytrace=False)
        data = json.loads(http_get(url + "/api/v1/targets"))
        targets = data["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    wait_for(scraped, 60, "Prometheus to scrape tailfloor", process.logs)
    return process, url


def instant_query(prometheus: str, expr: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"query": expr})
    try:
        body = http_get(f"{prometheus}/api/v1/query?{query}")
    except urllib.error.HTTPError as exc:
        pytest.fail(f"Prometheus rejected {expr!r}: {exc.read().decode()}", pytrace=False)
    data: dict[str, Any] = json.loads(body)
    assert data["status"] == "success", data
    return data


def finite_values(result: dict[str, Any]) -> list[float]:
    values = [float(item["value"][1]) for item in result["data"]["result"]]
    return [v for v in values if math.isfinite(v)]


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    type: str
    series: frozenset[str]
    exercised: bool


def families(exposition: str) -> dict[str, Family]:
    """Metric families by name, with the series names each one exports. A family counts as
    exercised when it has samples that moved (a counter or histogram above zero) or, for a
    gauge, any sample at all."""
    result: dict[str, Family] = {}
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                                                                 "_created"),
                "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}
    for family in text_string_to_metric_families(exposition):
        names = frozenset(family.name + s for s in suffixes.get(family.type, ("",)))
        moving = [s for s in family.samples if s.name.endswith(("_total", "_count"))]
        if family.type == "gauge":
            exercised = bool(family.samples)
        else:
            exercised = any(s.value > 0 for s in moving)
        result[family.name] = Family(family.name, family.type, names, exercised)
    return result


def run_load(base: str, fake: FakeUpstream, seconds: float, rules: Path | None = None,
             features: FeatureLoad | None = None) -> None:
    """A mixed load spread over ``seconds`` in rounds of at least ``ROUND_SECONDS``, so that
    several scrapes see every counter move: streamed and plain answers for two models and two
    agents, an upstream 500, a stream the upstream breaks, an answer without usage, a client
    that hangs up, bad JSON, /v1/models; with ``rules``, two good and then two bad edits of the
    rules directory; with ``features``, its round of transcript, floor and overflow requests."""
    clients = {agent: openai.OpenAI(base_url=f"{base}/agents/{agent}/v1", api_key="sk-test",
                                    max_retries=0, timeout=10)
               for agent in ("planner", "coder")}
    plain = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0, timeout=10)
    messages: Any = [{"role": "user", "content": "hello"}]
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline or rounds < MIN_ROUNDS:
        began = time.monotonic()
        rounds += 1
        for agent, client in clients.items():
            model = "fake-model" if agent == "planner" else "fake-model-mini"
            client.chat.completions.create(model=model, messages=messages)
            for _ in client.chat.completions.create(model=model, messages=messages,
                                                    stream=True):
                pass
        fake.push(fake_upstream.Reply(status=500))
        with pytest.raises(openai.InternalServerError):
            plain.chat.completions.create(model="fake-model", messages=messages)
        fake.push(fake_upstream.Reply(close_after_chunks=2))
        with pytest.raises(openai.APIError):
            for _ in plain.chat.completions.create(model="fake-model", messages=messages,
                                                   stream=True):
                pass
        fake.push(fake_upstream.Reply(usage=None))
        plain.chat.completions.create(model="fake-model", messages=messages)
        bad = urllib.request.Request(f"{base}/v1/chat/completions", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError, match="400"):
            urllib.request.urlopen(bad, timeout=5)
        plain.models.list()
        fake.push(fake_upstream.Reply(delay_between_chunks=0.2, pieces=5))
        hang_up_mid_stream(base)
        if features is not None:
            features.round(base, fake, rounds)
        if rules is not None:
            edit_rules(rules, rounds)
        time.sleep(max(ROUND_PAUSE, ROUND_SECONDS - (time.monotonic() - began)))


def edit_rules(rules: Path, round_number: int) -> None:
    """Rounds 1 and 2 reload good rules, 3 and 4 bad ones (each outcome twice, in different
    scrapes, so its increase is above zero). None of them changes what the floor does."""
    if round_number in (1, 2):
        (rules / "50-load.toml").write_text(
            f"[defaults]\nsummary_max_tokens = {4096 - round_number}\n")
    if round_number in (3, 4):
        (rules / "60-broken.toml").write_text(f"[defaults]\nno_such_field = {round_number}\n")


def hang_up_mid_stream(base: str) -> None:
    """Open a slow stream, read its first bytes, and close the socket."""
    url = urllib.parse.urlsplit(base)
    body = json.dumps({"model": "fake-model", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")

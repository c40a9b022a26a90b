"""Cold start: the listeners open before the first transcript scan is done.

A root with a few thousand Pi sessions, and the scan held (in the reader thread) until the
test lets it go: meanwhile ``/healthz`` answers at once, ``/readyz`` says not ready, and a
chat request is answered promptly, passed through as the client sent it (``indexing``).
Once the scan is done the proxy is ready and rewrites as usual.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from proxy.server.state import ProxyState
from tests.bench.bench_transcripts import session_text
from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy

SESSIONS = 2000


def _write_sessions(root: Path, count: int) -> None:
    rng = random.Random(3)
    for n in range(count):
        folder = root / f"--home-user-project{n // 100}--"
        folder.mkdir(parents=True, exist_ok=True)
        sid, text = session_text(n, 2500, rng)
        (folder / f"2026-01-01T00-00-00-000Z_{sid}.jsonl").write_text(text)


def _get(url: str) -> tuple[int, float]:
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            resp.read()
            return resp.status, time.perf_counter() - began
    except urllib.error.HTTPError as exc:
        return exc.code, time.perf_counter() - began


def _chat(url: str, body: bytes) -> tuple[float, str | None]:
    began = time.perf_counter()
    request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()
        return time.perf_counter() - began, resp.headers.get("x-tailfloor")


def test_probes_and_requests_are_served_while_the_first_scan_runs(
        fake: FakeUpstream, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    _write_sessions(root, SESSIONS)
    gate, scanning = threading.Event(), threading.Event()

    def hold_the_scan(state: ProxyState) -> None:
        assert state.transcripts is not None
        tracker = state.transcripts._tracker
        scan = tracker.scan

        def held() -> None:
            scanning.set()
            gate.wait(60)
            scan()

        tracker.scan = held  # type: ignore[method-assign]

    proxy: InProcessProxy | None = None
    try:
        proxy = InProcessProxy(fake, "--sessions", str(root), before_start=hold_the_scan,
                               wait_indexed=False, start_within=5.0)
        assert scanning.wait(5), "the scan never began"
        status, seconds = _get(proxy.admin_url + "/healthz")
        assert status == 200 and seconds < 1.0
        assert _get(proxy.url + "/healthz")[0] == 200
        assert _get(proxy.admin_url + "/readyz")[0] == 503
        body = orjson.dumps({"model": "m", "messages": [
            {"role": "user", "content": "Session 7 turn 1: please check"}]})
        seconds, verdict = _chat(proxy.url, body)
        assert seconds < 1.0
        assert verdict == "none; reason=indexing"
        assert fake.chat_requests()[-1].body == body  # passed through as it came
        assert proxy.sample("tailfloor_indexing_passthrough_total",
                            route="chat_completions") == 1
    finally:
        gate.set()
    assert proxy is not None
    deadline = time.monotonic() + 60
    while _get(proxy.admin_url + "/readyz")[0] != 200:
        assert time.monotonic() < deadline, "never ready after the scan"
        time.sleep(0.05)
    assert proxy.state.transcripts is not None
    assert len(proxy.state.transcripts.catalog) == SESSIONS
    _seconds, verdict = _chat(proxy.url, body)
    assert verdict is not None and "indexing" not in verdict
    proxy.stop()

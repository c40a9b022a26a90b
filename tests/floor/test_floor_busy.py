"""A floor decision that is not done in time: the request goes upstream as it came, and says so.

Through an in-process ``tailfloor serve`` over compacted sessions on disk, with the floor's
decision held back in its thread (as a cold restore behind a burst of others would be):
a request whose decision has not started within ``--floor-wait-ms`` is passed through
unchanged (the upstream gets the client's bytes), marked ``none; reason=busy`` and counted;
the request whose decision was running is waited for and restored. Once the thread is free
again the session is restored as before. Decisions run one at a time, in
one thread: a burst's decisions do not share the interpreter with each other and the
event loop all at once.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from proxy.server.state import ProxyState
from proxy.transcripts.catalog import Catalog
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import Transcript, conversation, put, request_for
from tests.floor.test_floor_lag_wait import rules_and_root
from tests.floor.test_floor_tenants import write_session
from tests.inprocess import InProcessProxy

BUSY = "none; reason=busy"


def _compacted(session_id: str) -> Transcript:
    t = Transcript(session_id)
    conversation(t, 20, tools_every=0, text=f"words of {session_id[-4:]}")
    t.compaction(f"The unique summary of session {session_id}.", t.message_ids()[-2])
    return t


def _sessions(tmp_path: Path, count: int) -> tuple[Path, Path, list[bytes]]:
    """Rules, a root of ``count`` compacted sessions, and each one's next request."""
    rules, root = rules_and_root(tmp_path)
    bodies = []
    for n in range(count):
        session = _compacted(f"01a22a55-0000-7000-8000-0000000b{n:04d}")
        write_session(root, session, stamp=f"2026-11-30T02-00-{n:02d}-000Z")
        catalog = Catalog()
        put(catalog, session)
        body = request_for(catalog, session.session_id, extra=[
            {"role": "user", "content": [{"type": "text", "text": f"next {n}"}]}])
        bodies.append(orjson.dumps({**body, "stream": False}))
    return rules, root, bodies


def _post(proxy: InProcessProxy, body: bytes) -> tuple[str, float]:
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response.headers["x-tailfloor"], time.monotonic() - began


def _hold(state: ProxyState, wrap: Callable[[Callable[[Any], Any], Any], Any]) -> None:
    real = state.floor.rewrite
    state.floor.rewrite = lambda ctx: wrap(real, ctx)  # type: ignore[method-assign]


def test_a_decision_not_started_in_time_passes_the_request_through_marked_busy(
        fake: FakeUpstream, tmp_path: Path) -> None:
    rules, root, bodies = _sessions(tmp_path, 2)
    gate, holding = threading.Event(), threading.Event()
    first_session = orjson.loads(bodies[0])["messages"][-1]["content"][0]["text"]

    def held(real: Callable[[Any], Any], ctx: Any) -> Any:
        if first_session in orjson.dumps(ctx.messages).decode():
            holding.set()
            gate.wait(10)  # a slow restore of another session holds the thread
        return real(ctx)

    proxy = InProcessProxy(fake, "--sessions", str(root), "--rules", str(rules),
                           "--floor-wait-ms", "100",
                           before_start=lambda state: _hold(state, held))
    try:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(_post, proxy, bodies[0])
            assert holding.wait(10)
            verdict, took = _post(proxy, bodies[1])
            assert verdict == BUSY
            assert took < 5, f"the request waited {took:.1f} s for its decision"
            assert fake.chat_requests()[-1].body == bodies[1]  # the client's bytes, unchanged
            assert proxy.sample("tailfloor_floor_busy_passthrough_total",
                                route="chat_completions", settled=False) == 1
            gate.set()
            # The request whose decision had started waited for it: restored.
            assert slow.result(timeout=20)[0].startswith("floor; restored=")
        verdict, _ = _post(proxy, bodies[1])  # the thread is free again
        assert verdict.startswith("floor; restored="), verdict
        sent = orjson.loads(fake.chat_requests()[-1].body)["messages"]
        assert sum(1 for m in sent[2:] if m["role"] in ("user", "assistant", "tool")) >= 8
        assert proxy.sample("tailfloor_floor_busy_passthrough_total",
                            route="chat_completions") == 1
    finally:
        gate.set()
        proxy.stop()


def test_decisions_run_one_at_a_time_in_one_thread(fake: FakeUpstream, tmp_path: Path) -> None:
    rules, root, bodies = _sessions(tmp_path, 4)
    lock = threading.Lock()
    running: list[int] = [0]
    most: list[int] = [0]
    threads: set[int] = set()

    def counted(real: Callable[[Any], Any], ctx: Any) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            threads.add(threading.get_ident())
        try:
            time.sleep(0.2)  # long enough for the other requests to arrive meanwhile
            return real(ctx)
        finally:
            with lock:
                running[0] -= 1

    proxy = InProcessProxy(fake, "--sessions", str(root), "--rules", str(rules),
                           "--floor-wait-ms", "0",  # no bound: every request waits its turn
                           before_start=lambda state: _hold(state, counted))
    try:
        with ThreadPoolExecutor(4) as pool:
            verdicts = [v for v, _ in pool.map(lambda b: _post(proxy, b), bodies)]
        assert all(v.startswith("floor; restored=") for v in verdicts), verdicts
        assert most[0] == 1, f"{most[0]} decisions ran at once"
        assert len(threads) == 1
    finally:
        proxy.stop()

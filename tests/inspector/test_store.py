"""The inspector's store: the last requests of each session, within one memory budget."""

from __future__ import annotations

import gc
from pathlib import Path

from proxy.inspector.store import UNIDENTIFIED, InspectorStore, held_bytes
from proxy.report import RequestReport

MIB = 1024 * 1024


def report(session: str | None, n: int, size: int = 100, **extra: object) -> RequestReport:
    text = f"{n}:" + "x" * size
    return RequestReport(
        request_id=f"r-{session}-{n}", at=1000.0 + n, route="chat_completions", model="m",
        agent="main", stream=False, status=200, verdict="none", seconds=0.1,
        proxy_seconds=0.001, session_id=session, method="header", body=text.encode(),
        messages=({"role": "user", "content": text},), **extra)  # type: ignore[arg-type]


def test_each_session_keeps_its_last_requests_most_recent_first() -> None:
    store = InspectorStore(per_session=3, budget=64 * MIB)
    for n in range(5):
        store.keep(report("a", n))
    store.keep(report("b", 0))
    store.keep(report(None, 0))
    store.keep(report("a", 5, floor_kind="floor", compaction="compacted:overflow",
                      overflow="recovered"))
    a = store.session("a")
    assert a is not None
    assert [k.report().request_id for k in a.requests] == ["r-a-3", "r-a-4", "r-a-5"]
    assert (a.seen, a.floors, a.compactions, a.overflows) == (6, 1, 1, 1)
    assert [s.session_id for s in store.sessions()] == ["a", UNIDENTIFIED, "b"]
    assert store.held == sum(k.bytes for s in store.sessions() for k in s.requests)


def test_the_budget_sheds_the_least_recently_active_sessions_first() -> None:
    one = held_bytes(report("x", 0, 10_000))
    store = InspectorStore(per_session=20, budget=one * 10)
    for session in "abcde":
        store.keep(report(session, 0, 10_000))
        store.keep(report(session, 1, 10_000))
    store.keep(report("a", 2, 10_000))  # a is the most recent now: b goes first
    b = store.session("b")
    assert b is not None and [k.report().request_id for k in b.requests] == ["r-b-1"]
    store.keep(report("a", 3, 10_000))
    assert store.held <= store.budget
    assert store.session("b") is None
    kept = store.session("a")
    assert kept is not None and len(kept.requests) == 4
    assert [s.session_id for s in store.sessions()] == ["a", "e", "d", "c"]


def test_a_request_larger_than_the_budget_is_not_kept() -> None:
    store = InspectorStore(per_session=20, budget=4 * MIB)
    store.keep(report("small", 0))
    store.keep(report("huge", 0, 8 * MIB))
    assert store.held <= store.budget
    assert store.session("huge") is None
    # everything older went before it did: nothing is worth more than the budget
    assert len(store) == 0


def test_a_flood_of_new_sessions_stays_within_the_budget() -> None:
    store = InspectorStore(per_session=20, budget=1 * MIB)
    for n in range(50_000):
        store.keep(report(f"s{n}", 0, 0))
    assert store.held <= store.budget
    assert 0 < len(store) <= store.budget // held_bytes(report("s", 0, 0))
    newest = next(store.sessions())
    assert newest.session_id == "s49999"


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_two_thousand_sessions_of_fifty_large_requests_hold_the_budget() -> None:
    budget = 32 * MIB
    store = InspectorStore(per_session=20, budget=budget)
    gc.collect()
    before = _rss()
    peak_held = 0
    for turn in range(50):
        for session in range(2000):
            store.keep(report(f"session-{session}", turn, 100 * 1024))
            peak_held = max(peak_held, store.held)
    gc.collect()
    grown = _rss() - before
    assert peak_held <= budget
    assert store.held > budget // 2  # it does keep what the budget allows
    assert grown <= budget + 64 * MIB, f"RSS grew by {grown / MIB:.0f} MiB"

"""The compaction store: prefix lookup, bounds, restart, crash consistency, files it touches."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.recovery.message_chain import prefix_chain
from proxy.recovery.sqlite_store import FILENAME, CompactionStore
from tests.recovery.crash_writer import PER_SESSION, record_for

REPO = Path(__file__).resolve().parents[2]


def history(n: int, tag: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(n):
        if k % 3 == 2:
            out.append({"role": "tool", "tool_call_id": f"call_{k - 1}", "content": f"out {k}"})
        elif k % 3 == 1:
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{k}", "type": "function",
                 "function": {"name": "bash", "arguments": f'{{"command": "ls {k}{tag}"}}'}}]})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": f"turn {k}{tag}"}]})
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_put_then_find_the_longest_matching_prefix(tmp_path: Path) -> None:
    store = CompactionStore(tmp_path / "state", clock=Clock())
    messages = history(30)
    short = store.put("s1", messages[:6], "summary of 6", 600)
    long = store.put("s1", messages[:18], "summary of 18", 1800)
    assert store.put("s1", history(12, tag="other")[:12], "elsewhere", 1).message_count == 12
    # the agent keeps sending its whole, growing history
    found = store.find_for(messages + history(3, tag="new"), "s1")
    assert found == long and found.summary == "summary of 18" and found.tokens_replaced == 1800
    assert store.find_for(messages[:10], "s1") == short
    assert store.find_for(messages[:5], "s1") is None
    assert store.find_for(messages, "s2") is None
    assert store.find_for(messages) == long  # without a key, the same prefix from any session
    # a different message in the middle breaks the prefix
    edited = [*messages[:3], {"role": "user", "content": "changed"}, *messages[4:]]
    assert store.find_for(edited, "s1") is None
    store.close()


def test_put_same_prefix_replaces_the_summary(tmp_path: Path) -> None:
    store = CompactionStore(tmp_path, clock=Clock())
    first = store.put("s", history(4), "v1", 10)
    second = store.put("s", history(4), "v2", 12)
    assert second.id == first.id and second.summary == "v2" and store.count() == 1


def test_touch_and_restart_keep_records(tmp_path: Path) -> None:
    clock = Clock()
    store = CompactionStore(tmp_path, clock=clock)
    record = store.put("s", history(6), "kept", 60)
    store.touch(record.id)
    store.close()
    reopened = CompactionStore(tmp_path, clock=clock)
    found = reopened.find_for(history(9), "s")
    assert found is not None and found.summary == "kept"
    assert found.used_at > record.used_at
    reopened.close()


def test_bounded_per_session_and_in_total_oldest_evicted(tmp_path: Path) -> None:
    clock = Clock()
    store = CompactionStore(tmp_path, max_per_session=3, max_total=5, clock=clock)
    msgs = history(20)
    for n in range(1, 6):
        store.put("a", msgs[:n], f"a{n}", n)
    assert store.count("a") == 3
    assert store.find_for(msgs[:2], "a") is None  # a1, a2 evicted
    oldest_a = store.find_for(msgs[:3], "a")
    assert oldest_a is not None
    store.touch(oldest_a.id)  # used recently: survives the total bound below
    for n in range(1, 4):
        store.put("b", msgs[:n], f"b{n}", n)
    assert store.count() == 5
    assert {r.summary for r in (store.find_for(msgs[:k], "a") for k in range(1, 6)) if r} == {
        "a3", "a5"}


def test_total_bytes_bound(tmp_path: Path) -> None:
    store = CompactionStore(tmp_path, max_total_bytes=10_000, clock=Clock())
    for n in range(1, 8):
        store.put(f"s{n}", history(n), "x" * 3000, n)
    assert store.count() == 3
    with pytest.raises(ValueError, match="exceeds"):
        CompactionStore(tmp_path / "b", max_summary_bytes=10).put("s", history(1), "y" * 11, 1)
    with pytest.raises(ValueError, match="at least one"):
        store.put("s", [], "z", 1)


def test_evict_applies_lowered_bounds_after_restart(tmp_path: Path) -> None:
    store = CompactionStore(tmp_path, clock=Clock())
    for n in range(1, 9):
        store.put("s", history(n), f"v{n}", n)
    store.close()
    smaller = CompactionStore(tmp_path, max_per_session=2, clock=Clock())
    assert smaller.evict() == 6
    assert smaller.count() == 2


def test_writes_only_inside_the_state_dir_with_private_modes(tmp_path: Path) -> None:
    state = tmp_path / "state" / "nested"
    store = CompactionStore(state, clock=Clock())
    store.put("s", history(3), "secret summary", 3)
    assert store.find_for(history(3)) is not None
    store.close()
    outside = [p for p in tmp_path.rglob("*") if state not in p.parents and p != state
               and p not in state.parents]
    assert outside == []
    names = {p.name for p in state.iterdir()}
    assert names <= {FILENAME, f"{FILENAME}-wal", f"{FILENAME}-shm"}
    assert stat.S_IMODE((state / FILENAME).stat().st_mode) == 0o600


def test_a_corrupt_file_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / FILENAME).write_bytes(b"this is not a database" * 100)
    store = CompactionStore(tmp_path, clock=Clock())
    store.put("s", history(2), "fresh", 2)
    assert store.count() == 1
    assert [p.name for p in tmp_path.glob(f"{FILENAME}.corrupt-*")]
    assert "unreadable" in caplog.text


def test_a_newer_schema_is_not_overwritten(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / FILENAME)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    store = CompactionStore(tmp_path, clock=Clock())
    assert store.count() == 0
    assert list(tmp_path.glob(f"{FILENAME}.corrupt-*"))


def _check_whole(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute("SELECT session_key, chain, message_count, summary, tokens_replaced, "
                            "size FROM compactions").fetchall()
    finally:
        conn.close()
    per_session: dict[str, int] = {}
    for session, chain, count, summary, tokens, size in rows:
        seq = int(summary.split("\n")[1].removeprefix("record "))
        want_session, messages, want_summary, want_tokens = record_for(seq)
        assert (session, count, summary, tokens) == (want_session, len(messages), want_summary,
                                                     want_tokens)
        assert chain == prefix_chain(messages)[-1]
        assert size == len(summary.encode())
        per_session[session] = per_session.get(session, 0) + 1
    return per_session


def test_killed_mid_write_leaves_only_whole_records(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(1234)
    start = 0
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.recovery.crash_writer", str(state), str(start)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        acked = [int(proc.stdout.readline()) for _ in range(rng.randint(20, 60))]
        time.sleep(rng.uniform(0, 0.01))  # land the kill anywhere inside the next puts
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        per_session = _check_whole(state / FILENAME)
        assert all(n <= PER_SESSION for n in per_session.values())
        store = CompactionStore(state)
        last = acked[-1]
        session, messages, summary, _ = record_for(last)
        found = store.find_for(messages, session)
        assert found is not None and found.summary == summary  # acknowledged survives the kill
        store.close()
        start = last + 1000

"""What tracking a session costs in memory: a scan keeps no entry objects, and only the
sessions requests read from (a bounded number) keep theirs, without changing any answer."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from proxy.transcripts.cache_bounds import cache_bounds
from proxy.transcripts.catalog import SERVED_SESSIONS, Catalog
from proxy.transcripts.entries import parse_entry
from proxy.transcripts.index import ContentIndex
from proxy.transcripts.records import SessionInfo, Window
from proxy.transcripts.tracker import Tracker
from tests.bench.bench_transcripts import session_text
from tests.transcripts.test_views import MemStore, conversation, user

REPO = Path(__file__).resolve().parents[2]
SESSIONS = 600
BUDGET = 4096  # bytes a tracked session may hold (issue 28, target 5)


def _write(root: Path, count: int) -> None:
    rng = random.Random(28)
    for d in range(count // 100):
        folder = root / f"--home-user-project{d}--"
        folder.mkdir(parents=True)
        for i in range(100):
            sid, text = session_text(d * 100 + i, 19_000, rng)
            (folder / f"2026-01-01T00-00-00-000Z_{sid}.jsonl").write_text(text)


# Run in an interpreter of its own: in the test process, what ran before decides whether the
# table of interned strings (path parts are interned) grows during the scan, which once
# added ~1.6 KB a session to the count depending on the order the tests ran in.
_MEASURE = """
import gc, sys, tracemalloc
from pathlib import Path
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.tracker import Tracker
catalog = Catalog()
tracker = Tracker([Path(sys.argv[1])], catalog, lambda *_a: None)
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
tracker.scan()
gc.collect()
held = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
record = catalog.sessions()[0]
print(len(catalog), held, record.message_count, record.count_complete)
"""


def test_a_tracked_session_holds_at_most_4_kb_after_the_scan(tmp_path: Path) -> None:
    _write(tmp_path, SESSIONS)  # ~19 KB and ~15 entries each, read whole at start
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)],
                          check=False, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    tracked, held, messages, complete = done.stdout.split()
    assert int(tracked) == SESSIONS
    assert int(held) / SESSIONS <= BUDGET, f"{int(held) / SESSIONS:.0f} bytes a session"
    assert int(messages) > 10 and complete == "True"  # read whole, counted


def _session(n: int) -> tuple[SessionInfo, MemStore]:
    objs = conversation(3 + n % 5)
    for o in objs:
        o["id"] = f"s{n}-{o['id']}"
        if o.get("parentId"):
            o["parentId"] = f"s{n}-{o['parentId']}"
    return SessionInfo(f"s{n}", "pi", "pi", f"mem{n}"), MemStore(objs)


def test_only_a_bounded_number_of_sessions_keep_entry_objects_and_answers_do_not_change(
        ) -> None:
    # A small cache, so the bound is tens of sessions: the walk of every state each step
    # below is quadratic in it (the default's 1,200 took 20-30 s).
    cache = 1024 * 1024
    bound = cache_bounds(cache).served_sessions
    catalog = Catalog(tail_limit=50, cache_bytes=cache)
    assert catalog.served.max_sessions == bound < SERVED_SESSIONS
    stores = {}
    for n in range(3 * bound):
        info, store = _session(n)
        stores[info.session_id] = store
        catalog.put(info, store, Window(store.entries(), True))
    states = catalog._states
    assert not any(st.live for st in states.values())  # put packs: nothing read yet
    rng = random.Random(3)
    for step in range(6 * bound):
        sid = f"s{rng.randrange(3 * bound)}"
        store = stores[sid]
        if step % 5 == 0:  # the transcript grows by a user message
            obj = user(f"{sid}-x{step}", store.objs[-1]["id"], f"more {step}")
            store.objs.append(obj)
            catalog.append(sid, [parse_entry(obj, len(store.objs) - 1)])
        # Oracle: the conversation is one line, so the tail is its last messages.
        want = [o["id"] for o in store.objs[-4:]]
        assert [t.entry_id for t in catalog.tail(sid, 4)] == want
        record = catalog.get(sid)
        assert record is not None and record.message_count == len(store.objs)
        live = [s for s, st in states.items() if st.live]
        assert len(live) <= bound
        assert set(live) <= set(catalog.served._kept)
        assert sid in live  # the session just read keeps its objects
    assert len(catalog.served) == bound  # full: the oldest were packed


def test_the_content_index_grows_in_small_tables() -> None:
    # A dict that doubles copies its whole table holding the GIL (100-180 ms for the 350,000
    # keys of 50,000 sessions): no table may hold more than a small share of the keys.
    index = ContentIndex()
    rng = random.Random(7)
    kept: dict[str, list[int]] = {}
    for n in range(20_000):
        keys = [rng.getrandbits(64) for _ in range(7)]
        kept[f"s{n}"] = keys
        index.add(f"s{n}", keys)
    index.add("shared", kept["s5"][:2])  # a key two sessions hold
    assert len(index) == 140_000
    assert max(len(table) for table in index._maps) <= len(index) // 32
    assert index.lookup(kept["s5"][0]) == {"s5", "shared"}
    assert index.lookup(kept["s9"][3]) == {"s9"}
    index.drop("s5", kept["s5"], keep=kept["s5"][:1])
    assert index.lookup(kept["s5"][0]) == {"s5", "shared"}  # still held
    assert index.lookup(kept["s5"][1]) == {"shared"}
    assert index.lookup(kept["s5"][2]) == frozenset()


def test_the_scan_lets_go_of_each_listed_path_once_read(tmp_path: Path) -> None:
    # 50,000 listed paths freed at once when the scan ended held the GIL for 30-50 ms: each
    # is let go once its file is read. Oracle: the Path objects alive at the first and at
    # the last file the scan opens.
    _write(tmp_path, 300)
    tracker = Tracker([tmp_path], Catalog(), lambda *_a: None)
    # Counted at the first and the last open only: a walk of every object costs seconds in
    # a test process that has run many tests before this one.
    opened = [0]  # a count: holding the paths would keep them alive
    alive: dict[int, int] = {}
    real = tracker._open_jsonl

    def counting(path: Path, kind: Any, read: Any = None) -> str | None:
        opened[0] += 1
        if opened[0] in (1, 300):
            alive[opened[0]] = sum(1 for o in gc.get_objects() if isinstance(o, Path))
        return real(path, kind, read)

    tracker._open_jsonl = counting  # type: ignore[method-assign]
    tracker.scan()
    assert opened[0] == 300
    assert alive[300] <= alive[1] - 250

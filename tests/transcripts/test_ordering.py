"""Groups keep their sessions in order as they arrive in any order (the links follow)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.transcripts.catalog import Catalog
from proxy.transcripts.ordering import Groups
from proxy.transcripts.records import SessionInfo, Window
from tests.transcripts.test_views import MemStore, conversation


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10_000)), unique_by=lambda t: t[1],
                max_size=60), st.booleans())
def test_neighbours_match_a_full_sort_whatever_the_arrival_order(
        arrivals: list[tuple[int, int]], warm: bool) -> None:
    created = {f"s{n}": float(t) for t, n in arrivals}
    groups = Groups(lambda sid: (created[sid], sid))
    for index, (_t, n) in enumerate(arrivals):
        if warm and index == len(arrivals) // 2:
            groups.before("dir", f"s{n}")  # the sorted keys exist from here: kept by insertion
        assert groups.add("dir", f"s{n}") is True
        assert groups.add("dir", f"s{n}") is False
    ordered = sorted(created, key=lambda sid: (created[sid], sid))
    for k, sid in enumerate(ordered):
        assert groups.before("dir", sid) == (ordered[k - 1] if k else None)
        assert groups.after("dir", [sid]) == ({ordered[k + 1]} if k + 1 < len(ordered) else set())


def test_a_removed_session_leaves_its_neighbours_linked() -> None:
    groups = Groups(lambda sid: (float(sid[1:]), sid))
    for sid in ("s3", "s1", "s2"):
        groups.add("dir", sid)
    assert groups.before("dir", "s3") == "s2"
    assert groups.remove("dir", "s2") and not groups.remove("dir", "s2")
    assert groups.before("dir", "s3") == "s1"
    assert groups.before("dir", "s1") is None and groups.members("dir") == ["s3", "s1"]


def _catalog_of(*sessions: tuple[str, float]) -> Catalog:
    catalog = Catalog()
    for sid, created in sessions:
        store = MemStore(conversation(1))
        catalog.put(SessionInfo(sid, "pi", "pi", "mem", created=created, group="d"), store,
                    Window(store.entries(), True))
    catalog.relink()
    return catalog


def _links(catalog: Catalog) -> dict[str, str | None]:
    links = {}
    for sid in "abc":
        record = catalog.get(sid)
        assert record is not None
        links[sid] = record.predecessor
    return links


def test_a_session_whose_start_time_moves_relinks_its_old_and_new_neighbours() -> None:
    catalog = _catalog_of(("a", 1.0), ("b", 2.0), ("c", 3.0))
    assert _links(catalog) == {"a": None, "b": "a", "c": "b"}
    info = catalog.info("b")
    assert info is not None
    catalog.update_info(replace(info, created=4.0))  # its header time became known: after c
    catalog.relink()
    assert _links(catalog) == {"a": None, "c": "a", "b": "c"}
    # the same when the session is read again from scratch
    catalog = _catalog_of(("a", 1.0), ("b", 2.0), ("c", 3.0))
    store = MemStore(conversation(1))
    catalog.put(SessionInfo("b", "pi", "pi", "mem", created=4.0, group="d"), store,
                Window(store.entries(), True))
    catalog.relink()
    assert _links(catalog) == {"a": None, "c": "a", "b": "c"}


class _CountingLock:
    """The catalog's lock, counting the sessions refreshed in each hold."""

    def __init__(self, catalog: Catalog) -> None:
        self._lock = threading.RLock()
        self.holds: list[int] = []
        self.refreshed = 0
        self._depth = 0
        refresh = catalog._refresh

        def counted(state: Any) -> None:
            self.refreshed += 1
            refresh(state)

        catalog._refresh = counted  # type: ignore[method-assign]

    def __enter__(self) -> None:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self.refreshed = 0

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(self.refreshed)
        self._lock.release()


def test_relinking_a_whole_first_scan_lets_the_lock_go_between_slices() -> None:
    # The event loop's lookups take this lock: one hold for 50,000 sessions stalled it.
    count = 1600
    catalog = Catalog()
    created = {f"s{n:04d}": float((n * 7919) % count) for n in range(count)}  # shuffled times
    for sid, at in created.items():
        store = MemStore(conversation(1))
        catalog.put(SessionInfo(sid, "pi", "pi", "mem", created=at, group="d"), store,
                    Window(store.entries(), True))
    lock = _CountingLock(catalog)
    catalog._lock = lock  # type: ignore[assignment]
    catalog.relink()
    assert sum(lock.holds) == count
    assert max(lock.holds) <= 500 and len([h for h in lock.holds if h]) >= count // 500
    ordered = sorted(created, key=lambda sid: created[sid])
    for before, sid in itertools.pairwise(ordered):
        record = catalog.get(sid)
        assert record is not None and record.predecessor == before

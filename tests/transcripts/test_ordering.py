"""Groups keep their sessions in order as they arrive in any order (the links follow)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.transcripts.ordering import Groups


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

"""What a session's window keeps counted between requests: the active branch (always the
branch a fresh walk of the window finds, whatever the transcript does: grows, branches off,
starts a new root, repeats an id, is trimmed or read again; kept only for sessions requests
read from, one each) and its raw messages (always a recount's)."""

from __future__ import annotations

import random
from typing import Any

from proxy.transcripts import view
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.entries import Entry, parse_entry
from proxy.transcripts.records import SessionInfo, Window
from proxy.transcripts.state import SessionState
from tests.transcripts.test_views import MemStore, conversation, reply, user


def _fresh(st: SessionState) -> tuple[list[Entry], bool]:
    """The oracle: the window walked from scratch, as ``path`` did before it kept anything."""
    branch = view.active_branch(list(st.entries))
    path = list(branch.entries)
    rooted = bool(path) and path[0].parent_id is None
    if branch.missing_parent is not None and st.complete:
        rooted = True
    return path, rooted or (st.complete and not path)


def _ids(path: tuple[list[Entry], bool]) -> tuple[list[str], bool]:
    return [e.id for e in path[0]], path[1]


def _entry(obj: dict[str, Any], pos: int) -> Entry:
    return parse_entry(obj, pos, size=100)


def test_appends_that_continue_branch_off_or_restart_match_a_fresh_walk() -> None:
    rng = random.Random(5)
    objs = conversation(6)
    st = SessionState(SessionInfo("s", "pi", "pi", "mem"), MemStore(objs))
    st.set_window([_entry(o, i) for i, o in enumerate(objs)], complete=True)
    ids = [o["id"] for o in objs]
    for step in range(400):
        assert _ids(st.path(keep=True)) == _ids(_fresh(st)), step
        assert st.raw == sum(1 for e in st.entries if e.is_raw_message), step
        choice = rng.random()
        if choice < 0.6:
            parent: str | None = st.entries[-1].id  # the common case: the leaf grows
        elif choice < 0.8:
            parent = rng.choice(ids)  # a branch off an earlier entry (Pi's /tree)
        elif choice < 0.85:
            parent = None  # a second root
        elif choice < 0.9:
            parent = f"gone{step}"  # a parent the window does not hold
        else:
            parent = st.entries[-1].parent_id  # a sibling of the leaf
        new_id = f"n{step}" if rng.random() > 0.05 else rng.choice(ids)  # a repeated id
        make = user if step % 2 else reply
        obj = make(new_id, parent, f"text {step}")
        if step % 7 == 0:
            obj = reply(new_id, parent, "failed", stop="error")  # not a raw message
        added = st.append([_entry(obj, 1000 + step)])
        ids += [e.id for e in added]
        if step % 97 == 96:
            st.trim(20)  # the window drops its oldest entries
        if step % 151 == 150:
            st.set_window(list(st.entries[-30:]), complete=False)  # read again
    assert _ids(st.path(keep=True)) == _ids(_fresh(st))


def test_an_append_that_closes_a_parent_cycle_is_walked_again() -> None:
    # B's parent A is not in the window; then A comes with B as its parent (a corrupt or
    # hostile transcript): the kept branch must not keep "A" as the missing parent.
    objs = [user("B", "A", "first")]
    st = SessionState(SessionInfo("s", "pi", "pi", "mem"), MemStore(objs))
    st.set_window([_entry(objs[0], 0)], complete=True)
    assert _ids(st.path(keep=True)) == _ids(_fresh(st))
    st.append([_entry(reply("A", "B", "second"), 1)])
    assert _ids(st.path(keep=True)) == _ids(_fresh(st))
    assert view.active_branch(list(st.entries)).missing_parent is None


def test_a_catalog_tail_follows_the_branch_the_transcript_switches_to() -> None:
    objs = conversation(5)
    store = MemStore(objs)
    cat = Catalog(tail_limit=50)
    cat.put(SessionInfo("s", "pi", "pi", "mem"), store, Window(store.entries(), True))
    before = [t.entry_id for t in cat.tail("s", 4)]
    assert before == ["u3", "a3", "u4", "a4"]
    # The agent goes back to answer 1 and continues from there: a new branch.
    grown = [user("b0", "a1", "another way"), reply("b1", "b0", "then this")]
    store.objs += grown
    cat.append("s", [_entry(o, len(objs) + i) for i, o in enumerate(grown)])
    assert [t.entry_id for t in cat.tail("s", 4)] == ["u1", "a1", "b0", "b1"]
    more = [user("b2", "b1", "and on")]
    store.objs += more
    cat.append("s", [_entry(more[0], len(store.objs) - 1)])
    assert [t.entry_id for t in cat.tail("s", 3)] == ["b0", "b1", "b2"]


def test_only_sessions_read_from_keep_a_branch_and_one_each() -> None:
    objs = conversation(40)
    st = SessionState(SessionInfo("s", "pi", "pi", "mem"), MemStore(objs))
    st.set_window([_entry(o, i) for i, o in enumerate(objs)], complete=True)
    # Refreshing a record (a scan, an append) walks the branch without keeping it.
    assert st.branch() is not st.branch()
    kept = st.branch(keep=True)
    assert st.branch() is kept
    for i in range(100):
        st.append([_entry(user(f"x{i}", st.entries[-1].id, "more"), 500 + i)])
        assert st.branch() is not kept  # replaced by its continuation, not added to
        kept = st.branch()
    # What is kept is the window's branch itself (as long as the window), not a history.
    assert len(kept.entries) == len(st.entries) == len(objs) + 100
    st.trim(30)
    assert st.branch() is not st.branch()  # a trimmed window is walked again when asked
    assert len(st.path(keep=True)[0]) == len(st.entries) <= 30 + max(8, 30 // 4)


def test_a_packed_window_is_the_window_it_was() -> None:
    # Packing (every session between the requests that read it) changes nothing the
    # session answers: entries, raw count, branch, counts, marks; unpacked when read.
    rng = random.Random(11)
    objs = conversation(8)
    st = SessionState(SessionInfo("s", "pi", "pi", "mem"), MemStore(objs))
    st.set_window([_entry(o, i) for i, o in enumerate(objs)], complete=True)
    for step in range(300):
        parent = st.entries[-1].id if rng.random() < 0.8 else f"u{rng.randrange(8)}"
        make = user if step % 2 else reply
        st.append([_entry(make(f"n{step}", parent, f"text {step}"), 1000 + step)])
        if step % 13 == 0:
            st.append([_entry({"type": "compaction", "id": f"c{step}", "parentId": f"n{step}",
                               "summary": f"summary {step}", "firstKeptEntryId": "u3"},
                              2000 + step)])
        if step % 37 == 36:
            st.trim(25)
        before = (list(st.entries), st.raw, _ids(_fresh(st)), dict(st.marks), st.size)
        keys = sorted(k for e in [*st.entries, *st.marks.values()] for k in e.keys)
        st.release()
        assert not st.live
        assert st.size == before[4]
        assert sorted(st.held_keys()) == keys
        assert st.first_pos == before[0][0].pos
        assert (st.entries, st.raw, _ids(st.path()), st.marks, st.size) == before
        assert st.live


def test_a_window_that_never_branched_has_the_branch_a_walk_finds() -> None:
    # view.active_branch takes a window that is one chain as it is, without the walk: the
    # oracle is the walk itself (given the window's entries by id, it never takes that way).
    rng = random.Random(4)
    for _ in range(500):
        n = rng.randint(1, 8)
        ids = [rng.choice("abcdefgh") for _ in range(n)] if rng.random() < 0.3 else \
            [f"e{i}" for i in range(n)]
        top = rng.choice([None, "elsewhere", ids[-1], ids[0]])
        entries = [_entry(user(ids[0], top, "t"), 0)]
        for i in range(1, n):
            parent = ids[i - 1] if rng.random() < 0.9 else rng.choice([*ids, "gone", None])
            entries.append(_entry(user(ids[i], parent, "t"), i))
        walked = view.active_branch(entries, {e.id: e for e in entries})
        assert view.active_branch(entries) == walked, entries

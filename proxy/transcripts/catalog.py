"""An in-memory view of every known session, with content indexes. No I/O of its own.

Per session: a bounded window of entry records (no message content) holding at most about
``tail_limit`` raw messages, plus every compaction and reset entry seen. Content comes from
the session's ``TranscriptStore`` when ``tail``/``context``/``full`` need it; a view that
starts before the window is computed from a fresh read. The content index (tool-call ids,
user text hashes, compaction summaries) covers the windows and follows them.

Threads: the readers (in a worker thread) mutate it while requests query it, on the event
loop and in worker threads. Every method holds one lock for its in-memory part only; reads
of a store happen outside it, so a slow disk never stalls a query. ``get`` and the ``find_*``
lookups never touch a store: they are safe on the event loop. ``tail``, ``context`` and
``full`` may read a store: call them off the loop.

Memory: a session's window is packed (see ``state``) but for the sessions requests read
from or transcripts grew lately (``served``): at most ``SERVED_SESSIONS`` of them, holding
``SERVED_ENTRIES`` entries together, keep theirs as objects.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Container, Mapping, Sequence
from dataclasses import replace
from typing import Any

from proxy.transcripts import loading, view
from proxy.transcripts.cache_bounds import DEFAULT_CACHE_BYTES, cache_bounds
from proxy.transcripts.entries import Entry, tool_call_key, user_text_key
from proxy.transcripts.index import ContentIndex
from proxy.transcripts.links import Links
from proxy.transcripts.records import (
    Pick,
    SessionInfo,
    SessionRecord,
    TailMessage,
    TranscriptStore,
    Window,
)
from proxy.transcripts.render import Flavor, RenderOptions
from proxy.transcripts.render_cache import RenderedTail
from proxy.transcripts.served import Served
from proxy.transcripts.state import SessionState, SettledWindow

__all__ = ["DEFAULT_CACHE_BYTES", "SERVED_ENTRIES", "SERVED_SESSIONS", "Catalog"]

_RELINK_SLICE = 500  # per hold of the lock, which the loop's lookups wait on (850 ms for 50k)
# Sessions whose windows are kept unpacked: an agent's requests each read its session
# several times, and unpacking a window of 300 entries costs about half a millisecond. By
# default (--session-cache-bytes) ~11 MB of entry objects (~300 bytes each).
_DEFAULTS = cache_bounds(DEFAULT_CACHE_BYTES)
SERVED_SESSIONS = _DEFAULTS.served_sessions
SERVED_ENTRIES = _DEFAULTS.served_entries


class Catalog:
    """All sessions: metadata, active-branch views, identification indexes. Mutators
    (``put``, ``append``, ``update_info``, ``remove``, ``relink``) are called by the readers;
    everything else is a query, and never raises for an unknown id (None or empty)."""

    def __init__(self, tail_limit: int = 200, render_options: RenderOptions | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.tail_limit = tail_limit
        self._opts = render_options or RenderOptions()
        flavors: tuple[Flavor, ...] = ("pi", "openclaw")  # made once: a rendering's cache key
        self._flavours = {f: replace(self._opts, flavor=f) for f in flavors}
        self._lock = threading.RLock()
        bounds = cache_bounds(cache_bytes)
        self.rendered = RenderedTail(bounds.rendered_bytes, bounds.rendered_entries,
                                     bounds.decoded_bytes)
        self._states: dict[str, SessionState] = {}
        self._sources: Counter[str] = Counter()  # the gauge reads it after every batch
        self._index = ContentIndex()
        self._links = Links(self._order)
        self._deferred: set[str] = set()
        self.served = Served(bounds.served_sessions, bounds.served_entries)

    # ----------------------------------------------------------------- mutators
    def put(self, info: SessionInfo, store: TranscriptStore, window: Window | SettledWindow,
            *, defer: bool = False) -> None:
        """Add or replace a session with the given window of entries (or settled already).

        ``defer``: skip computing its record until the next ``relink`` (bulk loading).
        The window is packed: a request that reads the session unpacks it.
        """
        if not isinstance(window, SettledWindow):  # as a scan worker settles it
            window = SessionState.settled(list(window.entries), window.complete, window.marks,
                                          self.tail_limit)
        with self._lock:
            old = self._states.get(info.session_id)
            if old is not None:
                self._sources[old.info.source] -= 1
                self._index.drop(info.session_id, old.held_keys(), keep=())
                self.served.discard(info.session_id)
                if old.info.created != info.created:
                    self._links.reorder(info)
            st = SessionState.adopt(info, store, window)
            self._index.add(info.session_id, st.held_keys())
            self._states[info.session_id] = st
            self._sources[info.source] += 1
            self._links.add(info)
            if defer:
                self._deferred.add(info.session_id)
            else:
                self._refresh(st)

    def append(self, session_id: str, entries: Sequence[Entry]) -> None:
        """Entries appended to a session's transcript, in order."""
        with self._lock:
            st = self._states.get(session_id)
            if st is None or not entries:
                return
            for e in st.append(entries):
                self._index.add(session_id, e.keys)
            self._trim(st)
            st.settle()
            self._serve(st)
            self._refresh(st)

    def update_info(self, info: SessionInfo) -> None:
        """New metadata for a known session (renamed file, new predecessor link...)."""
        with self._lock:
            st = self._states.get(info.session_id)
            if st is None:
                return
            moved = st.info.created != info.created
            self._sources[st.info.source] -= 1
            self._sources[info.source] += 1
            st.info = info
            if moved:
                self._links.reorder(info)
            self._links.add(info)
            self._refresh(st)

    def remove(self, session_id: str) -> None:
        with self._lock:
            st = self._states.pop(session_id, None)
            if st is None:
                return
            self._sources[st.info.source] -= 1
            self._index.drop(session_id, st.held_keys(), keep=())
            self.served.discard(session_id)
            self._links.remove(st.info)
            self._refresh_dependents(session_id)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._states

    def count_by_source(self) -> dict[str, int]:
        with self._lock:
            return {source: n for source, n in self._sources.items() if n > 0}

    def get(self, session_id: str) -> SessionRecord | None:
        """The session with this id, from memory (``compaction`` and ``resets`` may miss
        entries older than the kept window: ``full`` reads them)."""
        with self._lock:
            st = self._states.get(session_id)
            return st.record if st is not None else None

    def full(self, session_id: str) -> SessionRecord | None:
        """The session with exact ``compaction`` and ``resets``: the first call for a session
        whose window does not reach the top searches the older part of its transcript once
        (a store read)."""
        with self._lock:
            st = self._states.get(session_id)
            if st is None:
                return None
            before = st.first_pos
            if st.marks_known or st.complete or before is None:
                return st.record
            st.marks_known = True
            reader = getattr(st.store, "read_marks", None)
        marks = reader(before) if reader is not None else []
        with self._lock:
            if self._states.get(session_id) is st:
                added = st.add_marks(marks)
                for mark in added:
                    self._index.add(session_id, mark.keys)
                if added:  # the record's compaction may be older than the window
                    st.settle()
                    self._serve(st)
                self._refresh(st)
            return st.record

    def info(self, session_id: str) -> SessionInfo | None:
        with self._lock:
            st = self._states.get(session_id)
            return st.info if st is not None else None

    def key_scopes(self, session_key: str) -> list[str]:
        """The agent directories (scopes) that have sessions under this key."""
        with self._lock:
            return sorted(self._links.key_scopes(session_key))

    def by_key(self, session_key: str, scope: str | None = None) -> SessionRecord | None:
        """The current (newest) session of an OpenClaw session key; None when, without
        ``scope``, more than one scope has it (``agent:main:main`` repeats across
        installations: never guess a lineage)."""
        history = self.key_history(session_key, scope)
        return history[0] if history else None

    def key_history(self, session_key: str, scope: str | None = None) -> list[SessionRecord]:
        """Every session seen under a session key in one scope, newest first."""
        with self._lock:
            if scope is None:
                scopes = self._links.key_scopes(session_key)
                if len(scopes) != 1:
                    return []
                scope = next(iter(scopes))
            ids = self._links.key_members(scope, session_key)
            return [r for r in (self.get(i) for i in ids) if r is not None]

    def sessions(self, agent_id: str | None = None) -> list[SessionRecord]:
        """All sessions (or one agent's), most recently updated first."""
        with self._lock:
            records = [st.record for st in self._states.values() if st.record is not None
                       and (agent_id is None or st.info.agent_id == agent_id)]
        return sorted(records, key=lambda r: (r.updated or 0.0, r.session_id), reverse=True)

    def dangling_parent(self, session_id: str) -> str | None:
        """A parent id the active branch names but the (whole) transcript lacks."""
        with self._lock:
            st = self._states.get(session_id)
            return st.missing if st is not None and st.complete else None

    def find_tool_call(self, call_id: str) -> frozenset[str]:
        """Sessions whose kept tail holds this tool-call id (in any of its wire forms)."""
        with self._lock:
            return self._index.lookup(tool_call_key(call_id))

    def find_user_text(self, text: str) -> frozenset[str]:
        """Sessions whose kept tail holds a user message with this text (normalised, so
        OpenClaw's timestamp prefix and Runtime line do not matter)."""
        with self._lock:
            return self._index.lookup(user_text_key(text))

    def find_key(self, key: int | None) -> frozenset[str]:
        """Sessions holding an index key (``entries.user_text_key``, ``summary_key``)."""
        with self._lock:
            return self._index.lookup(key)

    def tail(self, session_id: str, k: int, before: str | None = None,
             roles: Container[str] | None = None, pick: Pick | None = None,
             *, window_only: bool = False) -> list[TailMessage]:
        """The last ``k`` raw messages (user, assistant bar failed turns, tool results,
        custom) of the active branch, oldest first (store reads): after the last reset, or
        with ``before`` = a reset entry's id the part that reset closed. Each carries its
        OpenAI rendering for this agent, on its own (no cross-message repairs). ``roles``:
        only those of the ``k`` with these roles are read and rendered; ``pick``: of those,
        the ones it picks (given them and the context edits that replace any);
        ``window_only``: of those the window holds (no store read but the renderings')."""
        with self._lock:
            st = self._states.get(session_id)
            if st is None or k <= 0:
                return []
            path, rooted = st.path(keep=True)
            self._serve(st)
            picked = view.tail_of(path, k, before)
            short = len(picked) < k and not view.segment_within(path, rooted, before) \
                and not window_only
            edits = view.replacements(path, picked)
        if short and (before is None or any(e.id == before for e in path)):
            # Read just enough from the end (``before`` in the window: and what the window
            # holds); a window up to tail_limit is kept, what is appended joins it, so the
            # next request for this session is served from memory.
            want = k + (st.raw if before is not None else 0)
            window = st.store.read_window(want)
            with self._lock:
                if want <= self.tail_limit and self._states.get(session_id) is st:
                    self._set_window(st, list(window.entries), window.complete, reread=True)
                    path, rooted = st.path(keep=True)
                    self._serve(st)
                else:
                    path = list(view.active_branch(window.entries).entries)
                    rooted = window.complete
            picked = view.tail_of(path, k, before)
            short = len(picked) < k and not view.segment_within(path, rooted, before)
            edits = view.replacements(path, picked)
        if short:
            whole = st.store.read_window(None)  # a branch that leaves the window
            path = list(view.active_branch(whole.entries).entries)
            picked = view.tail_of(path, k, before)
            edits = view.replacements(path, picked)
        if roles is not None:
            picked = [e for e in picked if (e.role or e.kind) in roles]
        if pick is not None:
            picked = pick(picked, edits)
        return self._tail_records(st, picked, edits)

    def edits(self, session_id: str) -> dict[str, str]:
        """Target id -> its latest context edit's id on the kept part of the active branch,
        from memory: how a reader of messages learns of an edit appended after it read them."""
        with self._lock:
            st = self._states.get(session_id)
            path = st.path()[0] if st is not None else []
            if st is not None:
                self._serve(st)
        return {target: edit.id for target, edit in view.edits_of(path).items()}

    def holds(self, session_id: str, needles: Sequence[bytes | re.Pattern[bytes]]
              ) -> bool | None:
        """Whether the session's transcript file holds any of ``needles`` (``file_span.
        file_holds_any``), without parsing it; None when its store cannot tell (SQLite)."""
        with self._lock:
            st = self._states.get(session_id)
            search = getattr(st.store, "holds", None) if st is not None else None
        return search(needles) if search is not None else None

    def context(self, session_id: str) -> list[dict[str, Any]] | None:
        """The messages the agent would send now, system prompt excluded (store reads)."""
        with self._lock:
            st = self._states.get(session_id)
            if st is None:
                return None
            path, rooted = st.path()
            self._serve(st)
            opts = self._flavour(st)
        plan = view.context_plan(path)
        if not rooted and not view.plan_is_local(path, plan):
            whole = st.store.read_window(None)
            plan = view.context_plan(view.active_branch(whole.entries).entries)
        return loading.render_plan(st.store, plan, opts)

    # ---------------------------------------------------------------- internals
    def _order(self, session_id: str) -> tuple[float, str]:
        st = self._states.get(session_id)
        created = st.info.created if st is not None else None
        return (created or 0.0, session_id)

    def _flavour(self, st: SessionState) -> RenderOptions:
        return self._flavours["pi" if st.info.source == "pi" else "openclaw"]

    def _tail_records(self, st: SessionState, picked: Sequence[Entry],
                      edits: Mapping[str, Entry]) -> list[TailMessage]:
        with self._lock:
            opts = self._flavour(st)
        return loading.tail_records(st.store, picked, edits, opts, self.rendered)

    def _set_window(self, st: SessionState, entries: list[Entry], complete: bool, *,
                    reread: bool = False) -> None:
        old = st.set_window(entries, complete, reread=reread)
        if old:
            self._index.drop(st.info.session_id, (k for e in old for k in e.keys),
                             keep=st.held_keys())
        self._index.add(st.info.session_id, [k for e in st.entries for k in e.keys])
        self._trim(st)
        st.settle()

    def _trim(self, st: SessionState) -> None:
        gone = st.trim(self.tail_limit)
        if gone:
            self._index.drop(st.info.session_id, (k for e in gone for k in e.keys),
                             keep=st.held_keys())

    def _serve(self, st: SessionState) -> None:
        """``st`` was read or grew: its window stays unpacked, and the sessions that were
        served longest ago are packed beyond the budget."""
        if st.live:
            for sid in self.served.touch(st.info.session_id, st.size):
                other = self._states.get(sid)
                if other is not None:
                    other.release()

    def relink(self) -> None:
        """Recompute the records of sessions whose key or directory gained or lost a session
        (a predecessor may have appeared after its successor)."""
        with self._lock:
            todo, self._deferred = self._deferred, set()
            todo |= self._links.pending()
        # Only the readers' thread changes the catalog: a slice sees what the last one left.
        ordered = list(todo)
        for start in range(0, len(ordered), _RELINK_SLICE):
            time.sleep(0.0005 if start else 0)  # a waiter's turn: a lock let go is retaken
            with self._lock:
                for sid in ordered[start:start + _RELINK_SLICE]:
                    st = self._states.get(sid)
                    if st is not None:
                        self._refresh(st)

    def _refresh_dependents(self, session_id: str) -> None:
        for st in self._states.values():
            if st.record is not None and st.record.predecessor == session_id:
                self._refresh(st)

    def _refresh(self, st: SessionState) -> None:
        """The session's record from what its window settled on (``SessionState.settle``,
        called by whatever changed the window) and its links now."""
        predecessor, link = self._links.predecessor(st.info)
        st.record = SessionRecord(
            info=st.info, updated=st.updated if st.updated is not None else st.info.created,
            message_count=(st.before_count or 0) + st.raw,
            count_complete=st.before_count is not None, compaction=st.compaction,
            resets=st.resets, predecessor=predecessor, link=link)

"""One session's bounded window of entry records, as the catalog keeps it. No I/O.

The window holds the newest entries (at most about ``limit`` raw messages; older ones are
trimmed) plus every compaction and reset entry seen (the *marks*). The catalog owns the
content index and updates it from what these methods return.

Between the requests that read a session its window is packed (``packed``): tens of
thousands of sessions are tracked, and most are never read again after the scan. ``entries``
unpacks it into ``Entry`` objects when something asks for them; ``release`` packs it again
(the catalog does, for all but the sessions requests read from lately). What the session's
record needs (last update, compaction, resets, a dangling parent) is worked out by
``settle`` whenever the window or the marks change, so records are made without unpacking.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from proxy.transcripts import packed, view
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import (
    CompactionInfo,
    ResetMark,
    SessionInfo,
    SessionRecord,
    TranscriptStore,
)

__all__ = ["SessionState", "SettledWindow"]

_MARK_KINDS = ("compaction", "reset")
# Shared by every session without a mark (most): read-only, so no session writes into it.
_NO_MARKS: Mapping[str, Entry] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SettledWindow:
    """A window as a session keeps it (trimmed, settled, packed), made where its entries
    were read: a scan worker sends it, and the catalog adopts it without unpacking."""

    blob: bytes
    odd: packed.Odd | None
    raw: int
    marks: tuple[Entry, ...]
    complete: bool
    before_count: int | None
    updated: float | None
    compaction: CompactionInfo | None
    resets: tuple[ResetMark, ...]
    missing: str | None
    read: int  # entries read (before trimming)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # sent for every session: made again by a call, not by the generic slotted state
        return SettledWindow, (self.blob, self.odd, self.raw, self.marks, self.complete,
                               self.before_count, self.updated, self.compaction, self.resets,
                               self.missing, self.read)


class SessionState:
    __slots__ = ("_blob", "_branch", "_by_id", "_entries", "_odd", "before_count", "compaction",
                 "complete", "info", "marks", "marks_known", "missing", "raw", "record",
                 "resets", "store", "updated")

    def __init__(self, info: SessionInfo, store: TranscriptStore) -> None:
        self.info = info
        self.store = store
        # The window: as objects (``_entries``) or packed (``_blob``, ``_odd``), never both.
        self._entries: list[Entry] | None = []
        self._blob = b""
        self._odd: packed.Odd | None = None
        self.raw = 0  # raw messages in the window, counted as it changes (every append asks)
        # built when first asked: most tracked sessions are never read again after the
        # scan, and the dict cost ~460 bytes a session
        self._by_id: dict[str, Entry] | None = None
        self.marks: Mapping[str, Entry] = _NO_MARKS
        self.complete = False
        self.marks_known = False
        # raw messages before the window, when known (the window once reached the top)
        self.before_count: int | None = None
        self.record: SessionRecord | None = None
        # The active branch as a request's ``path`` found it, while the window has not changed
        # but by appends that continue it: every request restoring from the session asks for
        # it (several times), and walking the whole window each time cost more than the rest.
        self._branch: view.Branch | None = None
        # What the record needs from the window, as ``settle`` last found it.
        self.updated: float | None = None  # the newest timestamp in the window
        self.compaction: CompactionInfo | None = None
        self.resets: tuple[ResetMark, ...] = ()
        self.missing: str | None = None  # a parent id the active branch names but lacks

    @classmethod
    def settled(cls, entries: list[Entry], complete: bool, marks: Sequence[Entry],
                limit: int) -> SettledWindow:
        """The window these entries make, as the catalog keeps it (``put`` adopts it)."""
        st = cls(None, None)  # type: ignore[arg-type]  # a window, no session yet
        read = len(entries)
        st.add_marks(marks)
        st.set_window(entries, complete)
        st.trim(limit)
        st.settle()
        st.release()
        return SettledWindow(st._blob, st._odd, st.raw, tuple(st.marks.values()), st.complete,
                             st.before_count, st.updated, st.compaction, st.resets,
                             st.missing, read)

    @classmethod
    def adopt(cls, info: SessionInfo, store: TranscriptStore, window: SettledWindow
              ) -> SessionState:
        st = cls(info, store)
        st._entries = None
        st._blob, st._odd, st.raw = window.blob, window.odd, window.raw
        st.marks = {m.id: m for m in window.marks} if window.marks else _NO_MARKS
        st.complete, st.before_count = window.complete, window.before_count
        st.updated, st.compaction = window.updated, window.compaction
        st.resets, st.missing = window.resets, window.missing
        return st

    # ------------------------------------------------------------- packing
    @property
    def entries(self) -> list[Entry]:
        """The window's entries, oldest first (unpacked when packed)."""
        found = self._entries
        if found is None:
            found = self._entries = packed.unpack(self._blob, self._odd)
            self._blob, self._odd = b"", None
        return found

    @property
    def live(self) -> bool:
        """Whether the window is held as objects (``release`` packs it)."""
        return self._entries is not None

    @property
    def size(self) -> int:
        """Entries in the window (without unpacking)."""
        return len(self._entries) if self._entries is not None else packed.count(self._blob)

    def release(self) -> None:
        """Pack the window: its objects, entries by id and kept branch are let go."""
        if self._entries is not None:
            self._blob, self._odd = packed.pack(self._entries)
            self._entries = self._by_id = self._branch = None

    @property
    def first_pos(self) -> int | None:
        """Where the window's first entry is (None: an empty window)."""
        if self._entries is not None:
            return self._entries[0].pos if self._entries else None
        return packed.first_pos(self._blob, self._odd)

    def held_keys(self) -> Iterator[int]:
        """The index keys of the window and the marks (some may repeat)."""
        if self._entries is not None:
            yield from (k for e in self._entries for k in e.keys)
        else:
            yield from packed.keys_of(self._blob, self._odd)
        yield from (k for m in self.marks.values() for k in m.keys)

    def settle(self) -> None:
        """Work out what the record needs, after the window or the marks changed."""
        branch = self.branch()
        if self.marks:  # every compaction and reset of the window is one of them
            path, rooted = self._path_of(branch)
            self.compaction, self.resets = view.boundaries(path, rooted, self.marks.values())
        else:
            self.compaction, self.resets = None, ()
        self.updated = max((e.timestamp for e in self.entries if e.timestamp is not None),
                           default=None)
        self.missing = branch.missing_parent

    @property
    def by_id(self) -> dict[str, Entry]:
        """The window's entries by id."""
        found = self._by_id
        if found is None:
            found = self._by_id = {e.id: e for e in self.entries}
        return found

    @property
    def by_id_if_built(self) -> dict[str, Entry] | None:
        """``by_id`` when something built it already (a reader that can do without)."""
        return self._by_id

    def branch(self, keep: bool = False) -> view.Branch:
        """The active branch in the window: the kept one while the window has changed only
        by appends that continue it, else walked (and kept with ``keep``: a session that
        requests read from, not every session a scan or an append refreshes)."""
        branch = self._branch
        if branch is None:
            branch = view.active_branch(self.entries, self._by_id)  # no dict kept at a scan
            if keep:
                self._branch = branch
        return branch

    def path(self, keep: bool = False) -> tuple[list[Entry], bool]:
        """The active branch's entries in the window, and whether it starts at the root."""
        return self._path_of(self.branch(keep))

    def _path_of(self, branch: view.Branch) -> tuple[list[Entry], bool]:
        path = list(branch.entries)
        rooted = bool(path) and path[0].parent_id is None
        if branch.missing_parent is not None and self.complete:
            rooted = True  # a dangling parent in a complete file: the branch ends there
        return path, rooted or (self.complete and not path)

    def set_window(self, entries: list[Entry], complete: bool, *, reread: bool = False
                   ) -> list[Entry]:
        """Replace the window; returns the entries it held before."""
        old = self.entries
        if reread and old and entries:
            # keep what was appended since the store's view (it may lag the file by a line)
            known = {e.id for e in entries}
            entries = entries + [e for e in old if e.id not in known and e.pos > entries[-1].pos]
        self._entries = entries
        self._blob, self._odd = b"", None
        self.raw = sum(1 for e in entries if e.is_raw_message)
        self._by_id = None
        self._branch = None
        self.complete = complete
        self.before_count = 0 if complete else None
        for e in entries:
            if e.kind in _MARK_KINDS:
                self._mark(e)
        return old

    def _mark(self, entry: Entry) -> None:
        marks = self.marks
        if not isinstance(marks, dict):
            marks = self.marks = {}
        marks[entry.id] = entry

    def append(self, entries: Sequence[Entry]) -> list[Entry]:
        """Entries appended to the transcript; returns those that were new."""
        added = []
        for e in entries:
            if e.id in self.by_id:
                continue  # already read by an on-demand re-read of the transcript
            self._branch = self._continued(e)
            self.entries.append(e)
            self.raw += e.is_raw_message
            self.by_id[e.id] = e
            if e.kind in _MARK_KINDS:
                self._mark(e)
            added.append(e)
        return added

    def _continued(self, entry: Entry) -> view.Branch | None:
        """The kept branch with ``entry`` (about to be appended) as its new leaf, when the
        walk from it would find the kept branch again: its parent is the current leaf
        (the entry the walk would reach by that id). Otherwise None: walked again."""
        branch = self._branch
        if branch is None or not branch.entries or not self.entries:
            return None
        leaf = self.entries[-1]
        if branch.entries[-1] is not leaf or entry.parent_id is None \
                or self.by_id.get(entry.parent_id) is not leaf \
                or entry.id == branch.missing_parent:  # it closes a cycle: walked again
            return None
        return view.Branch((*branch.entries, entry), branch.missing_parent)

    def add_marks(self, marks: Sequence[Entry]) -> list[Entry]:
        """Compaction and reset entries found before the window; returns the new ones."""
        new = [m for m in marks if m.id not in self.marks]
        for m in new:
            self._mark(m)
        return new

    def trim(self, limit: int) -> list[Entry]:
        """Drop the oldest entries beyond ``limit`` raw messages (with some slack so that
        appends do not trim every time); returns the dropped entries."""
        raw = self.raw
        if raw <= limit + max(8, limit // 4):
            return []
        drop = 0
        for e in self.entries:
            if raw <= limit:
                break
            drop += 1
            if e.is_raw_message:
                raw -= 1
        entries = self.entries
        gone, self._entries = entries[:drop], entries[drop:]
        self._branch = None
        dropped = self.raw - raw
        self.raw = raw
        if self.before_count is not None:
            self.before_count += dropped
        by_id = self._by_id
        if by_id is not None:
            for e in gone:
                by_id.pop(e.id, None)
        self.complete = False
        return gone

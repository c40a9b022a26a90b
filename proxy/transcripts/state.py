"""One session's bounded window of entry records, as the catalog keeps it. No I/O.

The window holds the newest entries (at most about ``limit`` raw messages; older ones are
trimmed) plus every compaction and reset entry seen (the *marks*). The catalog owns the
content index and updates it from what these methods return.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.transcripts import view
from proxy.transcripts.entries import Entry
from proxy.transcripts.records import SessionInfo, SessionRecord, TranscriptStore

__all__ = ["SessionState"]

_MARK_KINDS = ("compaction", "reset")


class SessionState:
    __slots__ = ("_branch", "_by_id", "before_count", "complete", "entries", "info", "marks",
                 "marks_known", "raw", "record", "store")

    def __init__(self, info: SessionInfo, store: TranscriptStore) -> None:
        self.info = info
        self.store = store
        self.entries: list[Entry] = []
        self.raw = 0  # raw messages in the window, counted as it changes (every append asks)
        # built when first asked: most tracked sessions are never read again after the
        # scan, and the dict cost ~460 bytes a session
        self._by_id: dict[str, Entry] | None = None
        self.marks: dict[str, Entry] = {}
        self.complete = False
        self.marks_known = False
        # raw messages before the window, when known (the window once reached the top)
        self.before_count: int | None = None
        self.record: SessionRecord | None = None
        # The active branch as a request's ``path`` found it, while the window has not changed
        # but by appends that continue it: every request restoring from the session asks for
        # it (several times), and walking the whole window each time cost more than the rest.
        self._branch: view.Branch | None = None

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
        branch = self.branch(keep)
        path = list(branch.entries)
        rooted = bool(path) and path[0].parent_id is None
        if branch.missing_parent is not None and self.complete:
            rooted = True  # a dangling parent in a complete file: the branch ends there
        return path, rooted or (self.complete and not path)

    @property
    def held(self) -> list[Entry]:
        """Every entry whose index keys the session keeps: the window and the marks."""
        return [*self.entries, *self.marks.values()]

    def set_window(self, entries: list[Entry], complete: bool, *, reread: bool = False
                   ) -> list[Entry]:
        """Replace the window; returns the entries it held before."""
        old = self.entries
        if reread and old and entries:
            # keep what was appended since the store's view (it may lag the file by a line)
            known = {e.id for e in entries}
            entries = entries + [e for e in old if e.id not in known and e.pos > entries[-1].pos]
        self.entries = entries
        self.raw = sum(1 for e in entries if e.is_raw_message)
        self._by_id = None
        self._branch = None
        self.complete = complete
        self.before_count = 0 if complete else None
        for e in entries:
            if e.kind in _MARK_KINDS:
                self.marks[e.id] = e
        return old

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
                self.marks[e.id] = e
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
            self.marks[m.id] = m
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
        gone, self.entries = self.entries[:drop], self.entries[drop:]
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

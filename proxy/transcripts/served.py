"""The sessions whose windows stay unpacked: those requests read from (or transcripts grew)
most recently, within a budget of sessions and of entries. Pure bookkeeping: the catalog
packs the sessions ``touch`` gives back."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Served"]


class Served:
    def __init__(self, max_sessions: int, max_entries: int) -> None:
        self.max_sessions = max_sessions
        self.max_entries = max_entries
        self.entries = 0  # entries of the sessions kept, as each last counted
        self._kept: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._kept

    def touch(self, session_id: str, entries: int) -> list[str]:
        """``session_id`` (now ``entries`` long) was served; returns the sessions to pack,
        least recently served first. The one just served is always kept, however long."""
        self.entries += entries - self._kept.pop(session_id, 0)
        self._kept[session_id] = entries
        out: list[str] = []
        while len(self._kept) > 1 and (len(self._kept) > self.max_sessions
                                       or self.entries > self.max_entries):
            sid, n = self._kept.popitem(last=False)
            self.entries -= n
            out.append(sid)
        return out

    def discard(self, session_id: str) -> None:
        """A session replaced or gone: no longer counted."""
        self.entries -= self._kept.pop(session_id, 0)

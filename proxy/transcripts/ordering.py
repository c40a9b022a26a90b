"""Sessions grouped by name (a Pi directory, an OpenClaw session key), oldest first. Pure.

A group's predecessor links follow the sessions' order: each session's predecessor is the
one just before it. A directory that gains 20,000 sessions at once must not sort itself
20,000 times, so each group keeps its sorted keys and a new session is inserted where it
belongs (a binary search); the neighbours of a session are found the same way. The sorted
lists hold the session ids alone, compared by their order (one list slot a session, where a
tuple of order and id cost some 130 bytes more: every Pi session is in a group).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

__all__ = ["Groups"]

class Groups:
    def __init__(self, order: Callable[[str], tuple[float, str]]) -> None:
        self._order = order
        self._members: dict[str, dict[str, None]] = {}
        self._sorted: dict[str, list[str]] = {}  # built on first use, kept up to date

    def __contains__(self, name: str) -> bool:
        return name in self._members

    def members(self, name: str) -> list[str]:
        return list(self._members.get(name, ()))

    def add(self, name: str, session_id: str) -> bool:
        """Put a session in a group; True when it was not in it."""
        members = self._members.setdefault(name, {})
        if session_id in members:
            return False
        members[session_id] = None
        keys = self._sorted.get(name)
        if keys is not None:
            bisect.insort(keys, session_id, key=self._order)
        return True

    def remove(self, name: str, session_id: str) -> bool:
        members = self._members.get(name)
        if members is None or session_id not in members:
            return False
        del members[session_id]
        self._sorted.pop(name, None)
        return True

    def reorder(self, name: str) -> None:
        """A member's order changed (its start time became known): sort again when asked."""
        self._sorted.pop(name, None)

    def before(self, name: str, session_id: str) -> str | None:
        """The session just before ``session_id`` in its group's order."""
        keys = self._keys(name)
        at = bisect.bisect_left(keys, self._order(session_id), key=self._order)
        if 0 < at < len(keys) and keys[at] == session_id:
            return keys[at - 1]
        return None

    def after(self, name: str, sessions: Iterable[str]) -> set[str]:
        """The session just after each of ``sessions`` in the group's order."""
        keys = self._keys(name)
        found: set[str] = set()
        for session_id in sessions:
            at = bisect.bisect_right(keys, self._order(session_id), key=self._order)
            if at < len(keys):
                found.add(keys[at])
        return found

    def _keys(self, name: str) -> list[str]:
        keys = self._sorted.get(name)
        if keys is None:
            keys = self._sorted[name] = sorted(self._members.get(name, ()), key=self._order)
        return keys

"""Content index: key (tool-call id or user-text hash, see ``entries``) -> session ids.

Most keys belong to one session, so a key maps to the session id itself and only becomes
a set when a second session shares it: this keeps the index small with many sessions.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ContentIndex"]


class ContentIndex:
    """Which sessions hold a key in their kept tail. Lookups are dict lookups."""

    def __init__(self) -> None:
        self._map: dict[int, str | set[str]] = {}

    def __len__(self) -> int:
        return len(self._map)

    def lookup(self, key: int | None) -> frozenset[str]:
        held = self._map.get(key) if key is not None else None
        if held is None:
            return frozenset()
        return frozenset((held,)) if isinstance(held, str) else frozenset(held)

    def add(self, sid: str, keys: Iterable[int]) -> None:
        for key in keys:
            held = self._map.get(key)
            if held is None:
                self._map[key] = sid
            elif isinstance(held, str):
                if held != sid:
                    self._map[key] = {held, sid}
            else:
                held.add(sid)

    def drop(self, sid: str, gone: Iterable[int], keep: Iterable[int]) -> None:
        """Forget the ``gone`` keys (of entries that left) that ``keep`` does not hold."""
        for key in set(gone).difference(keep):
            held = self._map.get(key)
            if held == sid:
                del self._map[key]
            elif isinstance(held, set):
                held.discard(sid)
                if len(held) == 1:
                    self._map[key] = next(iter(held))

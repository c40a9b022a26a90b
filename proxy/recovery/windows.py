"""What overflow recovery remembers in memory between requests, bounded.

- the context window each upstream model told us in an overflow error ("maximum context
  length is 8192 tokens"): it beats the rules' model table, which is a guess for most models;
- the sessions whose last answer showed a silent overflow: their next request is compacted
  before it is sent.

Both are small least-recently-used maps: a proxy sees few models, and a session marked silent
is cleared by its next request. Nothing here outlives the process (the windows are learned
again from the next error; the stored compactions live in the SQLite store) unless a shared
store passes the learned windows between replicas (``proxy.shared.facts``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, TypeVar

__all__ = ["BoundedMap", "LearnedWindows"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedMap(Generic[K, V]):
    """A dict that forgets its least recently used entries beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("limit must be positive")
        self._limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        return key in self._items

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)


class LearnedWindows:
    """Context windows stated by overflow errors, per upstream and model."""

    def __init__(self, limit: int = 1024) -> None:
        self._windows: BoundedMap[tuple[str, str], int] = BoundedMap(limit)
        # What this process learned, for a shared store to pass on to the other replicas.
        self.learned: deque[tuple[str, str, int]] = deque(maxlen=limit)

    def learn(self, upstream: str, model: str, window: int | None) -> bool:
        """Remember ``window``; True when it is new or changed."""
        if not self.merge(upstream, model, window):
            return False
        self.learned.append((upstream, model, window or 0))
        return True

    def merge(self, upstream: str, model: str, window: int | None) -> bool:
        """Remember a window another replica learned; True when it is new or changed."""
        if window is None or window <= 0:
            return False
        key = (upstream, model)
        if self._windows.get(key) == window:
            return False
        self._windows.put(key, window)
        return True

    def window(self, upstream: str, model: str) -> int | None:
        return self._windows.get((upstream, model))

"""What overflow recovery remembers in memory between requests, bounded.

- the context window each upstream model told us in an overflow error ("maximum context
  length is 8192 tokens"): it beats the rules' model table, which is a guess for most models;
- how many tokens each upstream model counts per token of our estimate (its own count from an
  overflow error, or an answer's usage, against ours): it replaces the table's margin, so a
  model whose tokenizer is not OpenAI's is budgeted by its own measure;
- the sessions whose last answer showed a silent overflow: their next request is compacted
  before it is sent.

Both are small least-recently-used maps: a proxy sees few models, and a session marked silent
is cleared by its next request. Nothing here outlives the process (the windows are learned
again from the next error; the stored compactions live in the SQLite store) unless a shared
store passes the learned windows between replicas (``proxy.replicas.facts``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["MAX_RATIO", "MIN_COUNTED", "BoundedMap", "LearnedWindows", "TokenRatios"]

# A ratio is believed between 1.0 (our count is never taken to be too high: the reserve covers
# a tokenizer that counts less) and 2.0 (beyond that the measure is more likely wrong than the
# tokenizer), and learned only from prompts large enough that framing tokens do not dominate.
MAX_RATIO = 2.0
MIN_COUNTED = 256
_MOVED = 0.05  # a change worth a log line
_STEP = 0.2  # the most one sample moves a learned ratio
K = TypeVar("K")
V = TypeVar("V")


def _nothing() -> None:
    return None


class BoundedMap(Generic[K, V]):
    """A dict that forgets its least recently used entries beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("limit must be positive")
        self._limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()
        self.changes = 0  # how many puts so far: what a reader compares to see any change

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
        self.changes += 1
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
        # Called after each fact learned here (a shared store passes it on at once).
        self.on_learned: Callable[[], None] = _nothing

    def learn(self, upstream: str, model: str, window: int | None) -> bool:
        """Remember ``window``; True when it is new or changed."""
        if not self.merge(upstream, model, window):
            return False
        self.learned.append((upstream, model, window or 0))
        self.on_learned()
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

    @property
    def changes(self) -> int:
        return self._windows.changes


class TokenRatios:
    """The upstream's prompt tokens per token of our estimate, per upstream and model."""

    def __init__(self, limit: int = 1024) -> None:
        self._ratios: BoundedMap[tuple[str, str], float] = BoundedMap(limit)
        # What this process learned, for a shared store to pass on to the other replicas.
        self.learned: deque[tuple[str, str, float]] = deque(maxlen=limit)
        # Called after each fact learned here (a shared store passes it on at once).
        self.on_learned: Callable[[], None] = _nothing

    def learn(self, upstream: str, model: str, measured: int | None, ours: int) -> float | None:
        """Remember ``measured / ours`` (bounded); the ratio when it is new or moved by more
        than ``_MOVED``, else None (also when the counts are too small to tell)."""
        if measured is None or measured < MIN_COUNTED or ours < MIN_COUNTED:
            return None
        ratio = min(MAX_RATIO, max(1.0, measured / ours))
        key = (upstream, model)
        before = self._ratios.get(key)
        if before is not None:
            # One sample moves it a step at most: an odd request (a tokenizer's worst case)
            # cannot swing every budget of the model at once.
            ratio = before + max(-_STEP, min(_STEP, ratio - before))
        ratio = round(ratio, 3)
        self._ratios.put(key, ratio)
        if before is not None and abs(ratio - before) <= _MOVED * before:
            return None
        self.learned.append((upstream, model, ratio))
        self.on_learned()
        return ratio

    def merge(self, upstream: str, model: str, ratio: float) -> None:
        """A ratio another replica learned (bounded like our own)."""
        if 1.0 <= ratio <= MAX_RATIO:
            self._ratios.put((upstream, model), ratio)

    def ratio(self, upstream: str, model: str) -> float | None:
        return self._ratios.get((upstream, model))

    @property
    def changes(self) -> int:
        return self._ratios.changes

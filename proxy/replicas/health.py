"""Whether the shared store is worth asking right now. Pure (a clock is passed in).

A store that fails (refused, timed out, out of memory) is left alone for a backoff that
doubles from ``first`` to ``longest``; then one request tries it again. The request path never
waits for a store known to be down, and each episode (from the first failure to the next
success) is reported once: ``failed`` says whether this failure opened one, ``succeeded``
whether this success closed one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["StoreHealth"]


@dataclass
class StoreHealth:
    clock: Callable[[], float]
    first: float = 0.5
    longest: float = 30.0
    _backoff: float = 0.0
    _retry_at: float = 0.0
    _failing: bool = False

    @property
    def failing(self) -> bool:
        return self._failing

    def usable(self) -> bool:
        """Whether to ask the store now: healthy, or its backoff has run out. While failing,
        one caller gets the try; the others go on without the store until it answers."""
        if not self._failing:
            return True
        now = self.clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self._backoff
        return True

    def failed(self) -> bool:
        """Record a failure; True when it starts an episode."""
        opened = not self._failing
        self._failing = True
        self._backoff = self.first if opened else min(self._backoff * 2, self.longest)
        self._retry_at = self.clock() + self._backoff
        return opened

    def succeeded(self) -> bool:
        """Record a success; True when it ends an episode."""
        closed = self._failing
        self._failing = False
        self._backoff = 0.0
        return closed

"""One summary per session at a time: a lock per session that exists while it is used."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["SessionLocks"]


class SessionLocks:
    """Per-session locks, kept only while held or awaited, so none is ever dropped in use
    (a size-bounded map could evict a held lock and let a second summary of the session run)
    and memory follows the requests in flight."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, session: str) -> AsyncIterator[bool]:
        """Hold the session's lock; yields whether another request held it first."""
        lock, users = self._locks.get(session) or (asyncio.Lock(), 0)
        self._locks[session] = (lock, users + 1)
        contended = lock.locked()
        try:
            async with lock:
                yield contended
        finally:
            lock, users = self._locks[session]
            if users <= 1:
                del self._locks[session]
            else:
                self._locks[session] = (lock, users - 1)

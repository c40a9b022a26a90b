"""One summary per session across replicas: a lock in the shared store.

A replica about to summarize a session takes ``tailfloor:lock:<session>`` (redis-py's lock:
``SET NX PX`` with a random token, released only by its holder). A replica that finds it
taken waits, at most ``wait`` seconds, for it to be released, and then looks for the summary
the holder stored before making its own (``Recovery._compact``). The lock expires by itself
(``expiry``) so a replica that dies while summarizing blocks the others for that long at most.
A store that does not answer is no reason to wait: the replica summarizes alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio.lock import Lock
from redis.exceptions import LockError

from proxy.shared.client import KEY_PREFIX, SharedClient, StoreUnavailable

__all__ = ["SharedSummaryLock"]


class SharedSummaryLock:
    def __init__(self, client: SharedClient, *, expiry: float = 150.0, wait: float = 130.0,
                 poll: float = 0.05) -> None:
        self._client = client
        self._expiry = expiry
        self._wait = wait
        self._poll = poll

    @asynccontextmanager
    async def hold(self, session: str) -> AsyncIterator[bool]:
        """Hold the session's lock (or not, when the store is away); yields whether another
        replica held it first."""
        lock = Lock(self._client.redis, f"{KEY_PREFIX}lock:{session}", timeout=self._expiry,
                    sleep=self._poll, thread_local=False, raise_on_release_error=False)
        owned, contended = False, False
        try:
            owned = await self._client.run(lambda _r: lock.acquire(blocking=False), "lock")
            if not owned:
                contended = True
                # The holder's summarizer call is what we wait for: its own timeout bounds it.
                owned = await self._client.run(
                    lambda _r: lock.acquire(blocking=True, blocking_timeout=self._wait),
                    "lock wait", limit=self._wait + 5)
        except (StoreUnavailable, LockError):
            owned = False
        try:
            yield contended
        finally:
            if owned:
                with contextlib.suppress(StoreUnavailable, LockError):  # it expires by itself
                    await self._client.run(lambda _r: lock.release(), "unlock")

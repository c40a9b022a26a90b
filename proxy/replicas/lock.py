"""One summary per session across replicas: a lock in the shared store.

A replica about to summarize a session takes ``tailfloor:lock:<session>`` (redis-py's lock:
``SET NX PX`` with our own random token, released only by its holder). The lock's expiry is
short (``expiry``) and the holder extends it while its summarizer call runs (a heartbeat), so
a replica that dies, or an acquire whose answer was lost, blocks the others for ``expiry`` at
most. A replica that finds the lock taken waits until it is released, expires or ``wait``
runs out (the caller passes the summarizer's own timeout), then looks for the summary the
holder stored before making its own (``Recovery._compact``). A store that does not answer is
no reason to wait: the replica summarizes alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio.lock import Lock
from redis.exceptions import LockError

from proxy.replicas.client import KEY_PREFIX, SharedClient, StoreUnavailable

__all__ = ["SharedSummaryLock"]


class SharedSummaryLock:
    def __init__(self, client: SharedClient, *, expiry: float = 10.0, poll: float = 0.05
                 ) -> None:
        self._client = client
        self._expiry = expiry
        self._poll = poll
        self._cleanups: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def hold(self, session: str, wait: float) -> AsyncIterator[bool]:
        """Hold the session's lock (or not, when the store is away); yields whether another
        replica held it first."""
        lock = Lock(self._client.redis, f"{KEY_PREFIX}lock:{session}", timeout=self._expiry,
                    sleep=self._poll, thread_local=False, raise_on_release_error=False)
        token = os.urandom(16).hex().encode()
        owned = contended = False
        try:
            owned = await self._client.run(
                lambda _r: lock.acquire(blocking=False, token=token), "lock")
            if not owned:
                contended = True
                owned = await self._client.run(
                    lambda _r: lock.acquire(blocking=True, blocking_timeout=wait, token=token),
                    "lock wait", limit=wait + 1)
        except (StoreUnavailable, LockError):
            # The SET may have landed after we gave up: remove it if it is ours.
            self._clean_up(lock, token)
            owned = False
        beat = asyncio.create_task(self._heartbeat(lock)) if owned else None
        try:
            yield contended
        finally:
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            if owned:
                with contextlib.suppress(StoreUnavailable, LockError):  # it expires by itself
                    await self._client.run(lambda _r: lock.release(), "unlock")

    async def _heartbeat(self, lock: Lock) -> None:
        """Keep the lock while the summary is being made; a holder that stops, expires."""
        while True:
            await asyncio.sleep(self._expiry / 3)
            with contextlib.suppress(StoreUnavailable, LockError):
                await self._client.run(
                    lambda _r: lock.extend(self._expiry, replace_ttl=True), "lock extend")

    def _clean_up(self, lock: Lock, token: bytes) -> None:
        async def release() -> None:
            lock.local.token = token
            for delay in (0.5, 1.0, 2.0):
                await asyncio.sleep(delay)
                with contextlib.suppress(StoreUnavailable, LockError):
                    await self._client.run(lambda _r: lock.release(), "unlock")
                    return

        task = asyncio.create_task(release())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

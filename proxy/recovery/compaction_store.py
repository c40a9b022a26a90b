"""Where recovery keeps its compactions: the interface, and the embedded SQLite store behind it.

Recovery asks four things of a store: whether a session may have compactions at all (a cheap
in-memory check that keeps small requests off the store), the stored compaction covering the
longest prefix of a request, a mark that one was used, and a place for a new one. The SQLite
store (``store.py``) is blocking and runs in worker threads; a shared store (Redis, in
``proxy.replicas``) is asynchronous. Both sit behind ``Compactions``.

A store that fails holds nothing for that request and takes nothing: recovery then summarizes
(a lookup error) or uses the summary without keeping it (a put error). Nothing here raises.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from proxy.recovery.sqlite_store import CompactionStore, StoredCompaction

__all__ = ["Compactions", "LocalCompactions", "Offload"]

T = TypeVar("T")


class Offload(Protocol):
    """Runs blocking work (disk, database, heavy counting) off the event loop."""

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]: ...


class Compactions(Protocol):
    name: str  # the metrics label of the store: sqlite, redis
    shared: bool  # other processes write to it too

    def may_hold(self, session: str) -> bool: ...

    async def find_for(self, messages: Sequence[Mapping[str, Any]], session: str
                       ) -> StoredCompaction | None: ...

    async def touch(self, found: StoredCompaction) -> None: ...

    async def put(self, session: str, summarized: Sequence[Mapping[str, Any]], summary: str,
                  tokens_replaced: int) -> str | None: ...

    async def close(self) -> None: ...


class LocalCompactions:
    """The SQLite store, its calls in worker threads, and the sessions it holds in memory
    (so a session with nothing stored costs no lookup)."""

    name = "sqlite"
    shared = False

    def __init__(self, store: CompactionStore, offload: Offload, *, max_sessions: int) -> None:
        self.store = store
        self._offload = offload
        self._max_sessions = max_sessions
        # sessions with stored compactions; evictions leave extra keys, which cost a lookup
        self._sessions = store.session_keys()

    def may_hold(self, session: str) -> bool:
        return session in self._sessions

    async def find_for(self, messages: Sequence[Mapping[str, Any]], session: str
                       ) -> StoredCompaction | None:
        if session not in self._sessions:
            return None
        try:
            return await self._offload(self.store.find_for, messages, session)
        except (sqlite3.Error, OSError):
            return None  # a broken store holds nothing: summarize (its put is counted)

    async def touch(self, found: StoredCompaction) -> None:
        with contextlib.suppress(sqlite3.Error, OSError):  # recency only
            await self._offload(self.store.touch, found.id)

    async def put(self, session: str, summarized: Sequence[Mapping[str, Any]], summary: str,
                  tokens_replaced: int) -> str | None:
        self._sessions.add(session)
        try:
            if len(self._sessions) > 2 * self._max_sessions:
                self._sessions = await self._offload(self.store.session_keys)
                self._sessions.add(session)
            await self._offload(self.store.put, session, summarized, summary, tokens_replaced)
        except (sqlite3.Error, OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]
        return None

    async def close(self) -> None:
        await self._offload(self.store.close)

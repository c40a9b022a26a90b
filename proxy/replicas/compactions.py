"""Compactions in the shared store, so every replica reuses the summary one of them made.

Keys (every one with a TTL, refreshed when used; a session keeps at most ``max_per_session``):

- ``tailfloor:c:<session>``: a hash from the chained fingerprint of a summarized prefix
  (``proxy.recovery.message_chain``) to ``[message count, tokens replaced, created, summary]``;
- ``tailfloor:u:<session>``: when each of them was last used (a sorted set: the least recently
  used go first past the cap);
- ``tailfloor:known``: the sessions that have compactions, by when one was last stored, so
  every replica learns which requests are worth a lookup (``SharedFacts`` reads it).

The longest-prefix lookup is one round trip: one HMGET of every chain of the request. When
the store does not answer, the local SQLite store stands in (what it holds: the compactions
made here while the shared store was away) and recovery goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from redis import asyncio as aioredis

from proxy.recovery.compaction_store import LocalCompactions, Offload
from proxy.recovery.message_chain import prefix_chain
from proxy.recovery.sqlite_store import StoredCompaction
from proxy.replicas.client import KEY_PREFIX, SharedClient, StoreUnavailable
from proxy.replicas.signing import Signer

__all__ = ["KNOWN_KEY", "SharedCompactions"]

KNOWN_KEY = KEY_PREFIX + "known"
_MAX_SUMMARY_BYTES = 1024 * 1024
_MAX_KNOWN = 100_000  # sessions remembered as having compactions, newest first
_MAX_MARKS = 10_000  # uses waiting for the next sync


def _entries(session: str) -> str:
    return f"{KEY_PREFIX}c:{session}"


def _entry(session: str, chain: str) -> str:
    """What one entry's seal covers: its hash and its field."""
    return f"{_entries(session)}\x00{chain}"


def _used(session: str) -> str:
    return f"{KEY_PREFIX}u:{session}"


class SharedCompactions:
    name = "redis"
    shared = True

    def __init__(self, client: SharedClient, local: LocalCompactions, offload: Offload, *,
                 ttl: float = 7 * 86400, max_per_session: int = 16,
                 clock: Callable[[], float] = time.time, signer: Signer | None = None
                 ) -> None:
        self._client = client
        self._signer = signer if signer is not None else Signer()
        self.local = local
        self._offload = offload
        self._ttl = max(int(ttl), 1)
        self._cap = max_per_session
        self._clock = clock
        self._known: OrderedDict[str, None] = OrderedDict()
        self._marks: dict[tuple[str, str], float] = {}  # (session, chain) -> used at

    # Sessions other replicas stored compactions for reach this set through SharedFacts.
    def learn_sessions(self, sessions: Iterable[str]) -> None:
        """Sessions with compactions (oldest first); the least recently heard of go past the
        bound. Only a hint: a forgotten session's lookup still happens once it needs one."""
        for session in sessions:
            self._known[session] = None
            self._known.move_to_end(session)
        while len(self._known) > _MAX_KNOWN:
            self._known.popitem(last=False)

    def may_hold(self, session: str) -> bool:
        return session in self._known or self.local.may_hold(session)

    async def find_for(self, messages: Sequence[Mapping[str, Any]], session: str
                       ) -> StoredCompaction | None:
        chains: list[str] = await self._offload(prefix_chain, messages)
        if not chains:
            return None
        try:
            values = await self._client.run(lambda r: r.hmget(_entries(session), chains),
                                            "lookup")
        except StoreUnavailable:
            return await self.local.find_for(messages, session)
        for position in range(len(chains), 0, -1):
            chain = chains[position - 1]
            raw = self._signer.unseal(_entry(session, chain), values[position - 1])
            if raw is None:
                continue
            found = _decode(session, chain, raw)
            if found is not None and found.message_count == position:
                return found
        # Stored here while the shared store was away, if anything.
        return await self.local.find_for(messages, session)

    async def touch(self, found: StoredCompaction) -> None:
        if found.id >= 0:  # from the local store
            await self.local.touch(found)
            return
        # Recency is no reason to hold the request: the marks go out with the next sync.
        if len(self._marks) < _MAX_MARKS:
            self._marks[(found.session_key, found.chain)] = self._clock()

    async def flush_marks(self) -> None:
        """Send the uses recorded since the last flush (one pipeline)."""
        marks, self._marks = self._marks, {}
        if not marks:
            return

        async def mark(redis: aioredis.Redis) -> None:
            async with redis.pipeline(transaction=False) as pipe:
                for (session, chain), when in marks.items():
                    pipe.zadd(_used(session), {chain: when}, xx=True)
                    pipe.expire(_used(session), self._ttl)
                    pipe.expire(_entries(session), self._ttl)
                await pipe.execute()

        with contextlib.suppress(StoreUnavailable):  # recency only
            await self._client.run(mark, "touch")

    async def put(self, session: str, summarized: Sequence[Mapping[str, Any]], summary: str,
                  tokens_replaced: int) -> str | None:
        if not summarized:
            return "nothing summarized"
        if len(summary.encode("utf-8", errors="replace")) > _MAX_SUMMARY_BYTES:
            return f"summary over {_MAX_SUMMARY_BYTES} bytes"
        chains: list[str] = await self._offload(prefix_chain, summarized)
        chain, now = chains[-1], self._clock()
        value = self._signer.seal(_entry(session, chain), orjson.dumps(
            [len(summarized), int(tokens_replaced), now, summary]))

        async def store(redis: aioredis.Redis) -> None:
            async with redis.pipeline(transaction=True) as pipe:
                pipe.hset(_entries(session), chain, value)
                pipe.zadd(_used(session), {chain: now})
                pipe.expire(_entries(session), self._ttl)
                pipe.expire(_used(session), self._ttl)
                pipe.zadd(KNOWN_KEY, {session: now})
                pipe.expire(KNOWN_KEY, self._ttl)
                pipe.zremrangebyscore(KNOWN_KEY, "-inf", now - self._ttl)
                pipe.zremrangebyrank(KNOWN_KEY, 0, -_MAX_KNOWN - 1)
                pipe.zrange(_used(session), 0, -self._cap - 1)
                *_done, surplus = await pipe.execute()
            if surplus:
                async with redis.pipeline(transaction=True) as pipe:
                    pipe.hdel(_entries(session), *surplus)
                    pipe.zrem(_used(session), *surplus)
                    await pipe.execute()

        try:
            await self._client.run(store, "store")
        except StoreUnavailable:
            return await self.local.put(session, summarized, summary, tokens_replaced)
        self.learn_sessions((session,))
        return None

    async def close(self) -> None:
        await self.local.close()


def _decode(session: str, chain: str, raw: bytes | str) -> StoredCompaction | None:
    """A stored entry, or None for one this build cannot read (written by another)."""
    try:
        count, tokens, created, summary = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    if not (isinstance(count, int) and isinstance(tokens, int) and isinstance(summary, str)
            and isinstance(created, int | float)):
        return None
    return StoredCompaction(-1, session, chain, count, summary, tokens, float(created),
                            float(created))

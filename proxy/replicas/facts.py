"""What replicas learn about upstreams and sessions, passed between them through the store.

Each process keeps its learned facts in memory (the request path reads only memory); this
module passes them on in the background:

- context windows learned from overflow errors, per upstream and model
  (``tailfloor:windows``, a hash), and the upstream's token count per token of our estimate
  (``tailfloor:ratios``);
- upstreams that refuse ``stream_options`` (``tailfloor:refusals``: until when);
- request fingerprints per session, for the carry of a session that names itself nowhere
  (``tailfloor:fp:<fingerprint>``: the sessions that sent it, newest last, at most
  ``PER_PRINT``);
- the sessions with stored compactions (``tailfloor:known``, written with each compaction).

``sync`` pushes what this process learned since the last round and reads what the others
did; ``pull_print`` reads one fingerprint's sessions at once, for the first request of a new
session, which cannot wait for the next round. Every key has a TTL. A store that does not
answer is skipped: each process goes on with what it knows.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

import orjson
from redis import asyncio as aioredis

from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.identity.prompt_prints import Fingerprints
from proxy.replicas.client import KEY_PREFIX, SharedClient, StoreUnavailable
from proxy.replicas.compactions import KNOWN_KEY
from proxy.replicas.signing import Signer
from proxy.upstream.stream_options import REMEMBER_SECONDS, StreamOptionsMemory

__all__ = ["PER_PRINT", "SharedFacts"]

T = TypeVar("T")
N = TypeVar("N", int, float)
WINDOWS_KEY = KEY_PREFIX + "windows"
RATIOS_KEY = KEY_PREFIX + "ratios"
REFUSALS_KEY = KEY_PREFIX + "refusals"
PER_PRINT = 64
_PULL_LIMIT = 10_000  # newly known sessions read per round


def _print_key(print_: str) -> str:
    return f"{KEY_PREFIX}fp:{print_}"


class KnownSessions(Protocol):
    def learn_sessions(self, sessions: list[str]) -> None: ...


class SharedFacts:
    def __init__(self, client: SharedClient, *, windows: LearnedWindows,
                 stream_options: StreamOptionsMemory, prints: Fingerprints,
                 compactions: KnownSessions, ratios: TokenRatios | None = None,
                 ttl: float = 7 * 86400,
                 clock: Callable[[], float] = time.time, signer: Signer | None = None
                 ) -> None:
        self._client = client
        self._signer = signer if signer is not None else Signer()
        self._windows = windows
        self._ratios = ratios if ratios is not None else TokenRatios()
        self._stream_options = stream_options
        self._prints = prints
        self._compactions = compactions
        self._ttl = max(int(ttl), 1)
        self._clock = clock
        self._known_since = 0.0

    def pending(self) -> bool:
        """Whether this process learned something the others have not been told."""
        return bool(self._windows.learned or self._ratios.learned
                    or self._stream_options.refusals or self._prints.recorded)

    async def sync(self) -> None:
        """One round: push what was learned here, read what was learned elsewhere."""
        await self.push()
        since = self._known_since

        async def read(redis: aioredis.Redis) -> list[object]:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(WINDOWS_KEY)
                pipe.hgetall(RATIOS_KEY)
                pipe.hgetall(REFUSALS_KEY)
                # Newest first: a replica that starts learns the sessions in use now.
                pipe.zrevrangebyscore(KNOWN_KEY, "+inf", since, start=0, num=_PULL_LIMIT,
                                      withscores=True)
                result: list[object] = await pipe.execute()
            return result

        try:
            windows, ratios, refusals, known = await self._client.run(read, "read facts")
        except StoreUnavailable:
            return
        if isinstance(windows, dict):
            for field, value in self._verified(WINDOWS_KEY, windows):
                upstream_model, window = _decode_pair(field, value, int)
                if upstream_model is not None:
                    self._windows.merge(*upstream_model, window)
        if isinstance(ratios, dict):
            for field, value in self._verified(RATIOS_KEY, ratios):
                upstream_model, ratio = _decode_pair(field, value, float)
                if upstream_model is not None:
                    self._ratios.merge(*upstream_model, ratio)
        if isinstance(refusals, dict):
            now = self._clock()
            for upstream, until in self._verified(REFUSALS_KEY, refusals):
                left = _float(until) - now
                if left > 0:
                    self._stream_options.merge(_text(upstream), min(left, REMEMBER_SECONDS))
        if isinstance(known, list) and known:
            self._compactions.learn_sessions([_text(s) for s, _score in reversed(known)])
            # From the scores read (the writers' clocks), not this replica's own clock, with
            # an overlap for a write that lands while we read. A writer whose clock is more
            # than that behind may be missed: this is a hint, the lookup happens anyway.
            self._known_since = max(float(score) for _s, score in known) - 5.0

    async def push(self) -> None:
        """Pass on what this process learned since the last push."""
        windows = _drain(self._windows.learned)
        ratios = _drain(self._ratios.learned)
        refusals = _drain(self._stream_options.refusals)
        prints = _drain(self._prints.recorded)
        if not (windows or ratios or refusals or prints):
            return
        now = self._clock()

        seal = self._sealed

        async def write(redis: aioredis.Redis) -> None:
            async with redis.pipeline(transaction=False) as pipe:
                for upstream, model, window in windows:
                    field = orjson.dumps([upstream, model])
                    pipe.hset(WINDOWS_KEY, field, seal(WINDOWS_KEY, field, window))
                if windows:
                    pipe.expire(WINDOWS_KEY, self._ttl)
                for upstream, model, ratio in ratios:
                    field = orjson.dumps([upstream, model])
                    pipe.hset(RATIOS_KEY, field, seal(RATIOS_KEY, field, ratio))
                if ratios:
                    pipe.expire(RATIOS_KEY, self._ttl)
                for upstream in refusals:
                    pipe.hset(REFUSALS_KEY, upstream, seal(REFUSALS_KEY, upstream.encode(),
                                                           now + REMEMBER_SECONDS))
                if refusals:
                    pipe.expire(REFUSALS_KEY, self._ttl)
                for session, print_ in prints:
                    key = _print_key(print_)
                    pipe.zadd(key, {self._signer.seal(key, session.encode()): now})
                    pipe.zremrangebyrank(key, 0, -PER_PRINT - 1)
                    pipe.expire(key, self._ttl)
                await pipe.execute()

        try:
            await self._client.run(write, "write facts")
        except StoreUnavailable:
            # Told later: put them back (bounded deques drop the oldest first).
            self._windows.learned.extend(windows)
            self._ratios.learned.extend(ratios)
            self._stream_options.refusals.extend(refusals)
            self._prints.recorded.extend(prints)

    def _sealed(self, key: str, field: bytes, value: float) -> bytes:
        return self._signer.seal(f"{key}\x00{_text(field)}", repr(value).encode())

    def _verified(self, key: str, values: dict[object, object]
                  ) -> list[tuple[object, bytes]]:
        """A hash's fields whose values carry a valid seal, with the values unsealed."""
        out: list[tuple[object, bytes]] = []
        for field, value in values.items():
            raw = value if isinstance(value, bytes | str) else str(value)
            unsealed = self._signer.unseal(f"{key}\x00{_text(field)}", raw)
            if unsealed is not None:
                out.append((field, unsealed))
        return out

    async def pull_window(self, upstream: str, model: str) -> bool:
        """Read the window another replica learned for ``model``; True when one was new.
        Asked before a request of a model this process knows no window of is decided: the
        replica that just met the overflow has pushed it, and the next round may be up to a
        second away."""
        field = orjson.dumps([upstream, model])
        try:
            raw = await self._client.run(lambda r: r.hget(WINDOWS_KEY, field), "read window")
        except StoreUnavailable:
            return False
        value = self._signer.unseal(f"{WINDOWS_KEY}\x00{_text(field)}", raw)
        if value is None:
            return False
        _pair, window = _decode_pair(field, value, int)
        return self._windows.merge(upstream, model, window)

    async def pull_print(self, print_: str) -> bool:
        """Read the sessions another replica saw sending ``print_``; True when one was new."""
        try:
            sessions = await self._client.run(
                lambda r: r.zrange(_print_key(print_), 0, -1), "read fingerprint")
        except StoreUnavailable:
            return False
        fresh = False
        for sealed in sessions[-PER_PRINT:]:
            raw = self._signer.unseal(_print_key(print_),
                                      sealed if isinstance(sealed, bytes | str) else None)
            if raw is None:
                continue
            session = _text(raw)
            # What this process recorded itself wins: the listing may be older than a
            # session's newer fingerprint.
            if self._prints.get(session) is None:
                self._prints.merge(session, print_)
                fresh = True
        return fresh


def _drain(queue: deque[T]) -> list[T]:
    """Everything queued so far; an item another thread adds meanwhile stays for next time."""
    items: list[T] = []
    while queue:
        try:
            items.append(queue.popleft())
        except IndexError:
            break
    return items


def _text(value: object) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _float(value: object) -> float:
    try:
        return float(_text(value))
    except ValueError:
        return 0.0


def _decode_pair(field: object, value: object, kind: Callable[[str], N]
                 ) -> tuple[tuple[str, str] | None, N]:
    """A ``[upstream, model]`` field and its number, or None for what this build cannot
    read."""
    try:
        upstream, model = orjson.loads(field if isinstance(field, bytes | str) else b"")
        number = kind(_text(value))
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None, kind("0")
    if not isinstance(upstream, str) or not isinstance(model, str):
        return None, number
    return (upstream, model), number

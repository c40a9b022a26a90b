"""Content index: key (tool-call id or user-text hash, see ``entries``) -> session ids.

Most keys belong to one session, so a key maps to the session id itself and only becomes
a set when a second session shares it: this keeps the index small with many sessions.

The keys are spread over 64 dicts by their low bits (they are hash digests: evenly). A dict
that grows copies its whole table at once, in C, holding the GIL: one dict of the 350,000
keys of 50,000 sessions stopped the event loop for 100-180 ms each time it doubled during
the scan; a shard doubles at 1/64 of that.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ContentIndex"]

_SHARDS = 64  # a power of two: a key's shard is its low bits


class ContentIndex:
    """Which sessions hold a key in their kept tail. Lookups are dict lookups."""

    def __init__(self) -> None:
        self._maps: list[dict[int, str | set[str]]] = [{} for _ in range(_SHARDS)]

    def __len__(self) -> int:
        return sum(map(len, self._maps))

    def lookup(self, key: int | None) -> frozenset[str]:
        held = self._maps[key & (_SHARDS - 1)].get(key) if key is not None else None
        if held is None:
            return frozenset()
        return frozenset((held,)) if isinstance(held, str) else frozenset(held)

    def add(self, sid: str, keys: Iterable[int]) -> None:
        maps = self._maps
        for key in keys:
            shard = maps[key & (_SHARDS - 1)]
            held = shard.get(key)
            if held is None:
                shard[key] = sid
            elif isinstance(held, str):
                if held != sid:
                    shard[key] = {held, sid}
            else:
                held.add(sid)

    def drop(self, sid: str, gone: Iterable[int], keep: Iterable[int]) -> None:
        """Forget the ``gone`` keys (of entries that left) that ``keep`` does not hold."""
        for key in set(gone).difference(keep):
            shard = self._maps[key & (_SHARDS - 1)]
            held = shard.get(key)
            if held == sid:
                del shard[key]
            elif isinstance(held, set):
                held.discard(sid)
                if len(held) == 1:
                    shard[key] = next(iter(held))

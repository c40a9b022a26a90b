"""What ``body_cost`` counts in a chat body, counted only past the start it shares with a
body seen lately. Pure (no I/O); safe to call from the event loop and a worker thread.

An agent sends its whole conversation every turn: the system prompt, the tools and every
earlier message again, then a few new bytes; agents of one runtime send the same system
prompt and tools. Counting a body's commas and looking for wide text takes three passes over
its bytes (~13 instructions a byte, ~700,000 for a 54 KB agent request), where comparing it
with an earlier body is one ``memcmp`` (well under one instruction a byte). So the counts of
a body are kept per block of ``BLOCK`` bytes, with the body, and the next body that begins
with the same bytes (the same ``KEY`` first bytes name the earlier body to try) takes the
counts of the blocks it shares, checked byte for byte, and counts only the rest. The result
is the same as counting the whole body, whatever the bodies are: nothing is taken from an
earlier body but counts of bytes found equal.

Kept bodies are told apart by their sender's credential as well (``owner``): a body counted
past a shared start is counted faster, and that difference must not tell one tenant whether
another sent a body that begins as its own does.

The bodies kept are held in memory past their requests: at most ``MAX_ENTRIES`` of them and
``MAX_BYTES`` in all, the oldest dropped first, none over ``MAX_KEPT`` (an agent's request
is tens to hundreds of KB; the 8 MB bodies of a hostile load are counted whole, not kept).
Bodies shorter than ``MIN_BYTES`` are counted whole (the look-up would cost more than it
saves) and not kept.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["BLOCK", "KEY", "MAX_BYTES", "MAX_ENTRIES", "MAX_KEPT", "MIN_BYTES", "Counted",
           "RecentBodies", "counted"]

BLOCK = 4096
KEY = 1024
MIN_BYTES = 4 * BLOCK
MAX_ENTRIES = 64
MAX_KEPT = 1024 * 1024
MAX_BYTES = 8 * 1024 * 1024
# A longer rest is looked at in place (the whole body), not copied to look at it alone: the
# copy would be memory outside the body budget.
_SLICE_AT_MOST = 64 * 1024


@dataclass(frozen=True, slots=True)
class Counted:
    raw: bytes
    # commas[i]: the commas in raw[:i * BLOCK], for every whole block and the start (i = 0).
    commas: tuple[int, ...]
    total: int  # all the body's commas
    escape: int  # where the first b"\\u" starts; -1 if none
    # How many whole blocks from the start are all ASCII (len(commas) when the body is).
    ascii_blocks: int

    @property
    def ascii(self) -> bool:
        return self.ascii_blocks >= len(self.commas)


def counted(raw: bytes, known: Counted | None = None, max_commas: int | None = None
            ) -> Counted | int:
    """The counts of ``raw``, those of the blocks it shares with ``known`` taken from it.
    Only its commas when they are more than ``max_commas`` (its wide text is then not looked
    for)."""
    shared = 0 if known is None else _shared_blocks(raw, known)
    start = shared * BLOCK
    marks = list(known.commas[:shared + 1]) if known is not None and shared else [0]
    total = marks[-1]
    count = raw.count
    for end in range(start + BLOCK, len(raw) + 1, BLOCK):
        total += count(b",", end - BLOCK, end)
        marks.append(total)
    total += count(b",", (len(marks) - 1) * BLOCK)
    if max_commas is not None and total > max_commas:
        return total
    if known is not None and known.escape >= 0 and known.escape + 2 <= start:
        escape = known.escape
    else:
        # No b"\\u" lies wholly in the shared start: one may begin at its last byte.
        escape = raw.find(b"\\u", max(0, start - 1))
    blocks = len(marks)
    if known is not None and known.ascii_blocks < shared:
        ascii_blocks = known.ascii_blocks  # the shared start itself is not ASCII
    elif raw.isascii() if not start or len(raw) - start > _SLICE_AT_MOST else (
            raw[start:].isascii()):  # the shared start is ASCII: the whole is, if the rest is
        ascii_blocks = blocks
    else:
        ascii_blocks = shared
        while raw[ascii_blocks * BLOCK:(ascii_blocks + 1) * BLOCK].isascii():
            ascii_blocks += 1
    return Counted(raw, tuple(marks), total, escape, ascii_blocks)


def _shared_blocks(raw: bytes, known: Counted) -> int:
    """How many whole blocks from the start ``raw`` and ``known.raw`` have equal."""
    high = min(len(raw), len(known.raw)) // BLOCK
    view = memoryview(known.raw)
    if raw.startswith(view[:high * BLOCK]):
        return high
    low = 0  # low blocks are shared, high are not
    while high - low > 1:
        middle = (low + high) // 2
        if raw.startswith(view[:middle * BLOCK]):
            low = middle
        else:
            high = middle
    return low


class RecentBodies:
    """The counts of the bodies seen lately, by their first ``KEY`` bytes (the latest of
    each start), at most ``max_entries`` bodies and ``max_bytes`` in all, each at most
    ``max_kept``."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES,
                 max_kept: int = MAX_KEPT) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, bytes], Counted] = {}
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_kept = min(max_kept, max_bytes)

    @property
    def held(self) -> int:
        return self._bytes

    def kept(self) -> list[bytes]:
        """The bodies kept, oldest first."""
        with self._lock:
            return [found.raw for found in self._entries.values()]

    def counted(self, raw: bytes, max_commas: int | None = None, *, keep: bool = True,
                owner: str = "") -> Counted | int:
        """``counted(raw)``, from the kept body of the same start and ``owner`` (the
        request's credential) if there is one; the result kept in its place when ``keep``."""
        if len(raw) < MIN_BYTES:
            return counted(raw, None, max_commas)
        key = (owner, raw[:KEY])
        with self._lock:
            known = self._entries.get(key)
        found = counted(raw, known, max_commas)
        if isinstance(found, Counted) and keep and len(raw) <= self.max_kept:
            self._keep(key, found)
        return found

    def _keep(self, key: tuple[str, bytes], found: Counted) -> None:
        with self._lock:
            entries = self._entries
            old = entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old.raw)
            entries[key] = found
            self._bytes += len(found.raw)
            while len(entries) > self.max_entries or self._bytes > self.max_bytes:
                oldest = next(iter(entries))
                self._bytes -= len(entries.pop(oldest).raw)

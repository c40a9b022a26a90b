"""Which relayed chunks the stream scanner must read: a regex's verdict, paid per chunk only
past the bytes the chunk shares with the stream's earlier chunks.

The scanner's regexes (usage, error, finish reason) have alternatives that all begin with a
quote, so sre tries a match at every quote of a chunk, and an OpenAI chunk has about 34,
most of them in a start every chunk of the stream repeats (``data: {"id":...,"object":...,
"created":...,"model":...,"choices":[{"index":0,"delta":{"``). A literal needle search
first does not help there: every chunk holds ``"finish_reason":null`` and ``"usage":null``,
and one ``bytes.find`` costs a sixth of the regex (its argument parsing).

So the common start of two successive chunks is learnt, cut before the first needle (a
literal that begins every match) it holds; a later chunk that begins with it is searched only
from the first of the start's last bytes that a needle can begin with (every needle begins
with a quote). No match can begin earlier: its needle would lie wholly in the start,
which holds none. The verdict is the regex's over the whole chunk, always.
"""

from __future__ import annotations

import re

MAX_START = 4096  # bytes of two chunks compared: learning stays cheap whatever they hold
MAX_LEARNS = 3  # per stream: chunks that never share a start cost only the plain search
# A learnt start is used only when it skips this many quotes: each is a match try the
# search saves (~120 instructions), against the comparison of the start (~800).
MIN_QUOTES = 10


class InterestTest:
    """``test(chunk)`` is ``pattern.search(chunk) is not None``, for a pattern each of whose
    matches begins with one of ``needles``, and which looks only forward (no anchor, no
    lookbehind)."""

    __slots__ = ("_last", "_learns", "_needles", "_pattern", "_reach", "_size", "_skip",
                 "_start")

    def __init__(self, pattern: re.Pattern[bytes], needles: tuple[bytes, ...]) -> None:
        self._pattern = pattern
        self._needles = needles
        self._start = b""  # the learnt start of a chunk: no needle in it
        self._size = 0
        self._skip = 0  # where a chunk that begins with the start is searched from
        self._last = b""  # the previous chunk that did not begin with the start
        self._learns = 0
        if not all(needle[:1] == b'"' for needle in needles):
            raise ValueError("every needle must begin with a quote (see _learn)")
        self._reach = max(map(len, needles)) - 1

    def test(self, data: bytes) -> bool:
        size = self._size
        if size:
            # A slice compared, not ``startswith``: its argument parsing costs more than the
            # copy.
            if data[:size] == self._start:
                return self._pattern.search(data, self._skip) is not None
        elif self._learns < MAX_LEARNS:
            self._learn(data)
        return self._pattern.search(data) is not None

    def _learn(self, data: bytes) -> None:
        """Learn the start ``data`` shares with the chunk before (once one is known, the
        chunks that do not begin with it, a stream's last few, are searched whole)."""
        last, self._last = self._last, data[:MAX_START]
        if not last:
            return
        self._learns += 1
        start = data[:common_prefix_length(last, self._last)]
        for needle in self._needles:
            at = start.find(needle)
            if at >= 0:
                start = start[:at]
        if start.count(b'"') < MIN_QUOTES:
            return
        self._start, self._size = start, len(start)
        # A needle that straddles the start's end began at one of its last quotes, and the
        # start's bytes from there are the needle's first.
        self._skip = len(start)
        at = start.find(b'"', max(0, len(start) - self._reach))
        while at >= 0:
            tail = start[at:]
            if any(needle.startswith(tail) for needle in self._needles):
                self._skip = at
                break
            at = start.find(b'"', at + 1)
        self._last = b""


def common_prefix_length(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (a binary search: equal
    prefixes of one length mean equal prefixes of every shorter one)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low

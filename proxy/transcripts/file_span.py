"""One span of a file's bytes, read with the fewest system calls; what a file's bytes hold.

A worker thread reads transcripts while the event loop runs Python. Every system call lets go
of the interpreter's lock, and getting it back from a busy loop takes up to the switch
interval. A buffered ``open(...).read()`` makes eight calls (open, fstat, ioctl, two seeks, two
reads, close); this makes three.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence

__all__ = ["file_holds_any", "read_span"]

_PIECE = 1 << 20  # bytes searched at a time: a transcript may be gigabytes
_PATTERN_REACH = 16  # the longest match a pattern given to ``file_holds_any`` may have
_SHARED_STOPS = 1024  # places of a group's first byte looked at in a piece, at most


def read_span(path: str | os.PathLike[str], start: int, size: int) -> bytes | None:
    """Bytes ``start`` to ``start + size`` of the file (fewer when it ends sooner), or None
    when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        parts: list[bytes] = []
        got = 0
        while got < size:  # a regular file answers a read whole unless it ends
            more = os.pread(fd, size - got, start + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):  # the descriptor is released even so
            os.close(fd)


def file_holds_any(path: str | os.PathLike[str], start: int,
                   needles: Sequence[bytes | re.Pattern[bytes]]) -> bool | None:
    """Whether the file holds any of ``needles`` (bytes, or patterns whose matches are at
    most 16 bytes long) from byte ``start`` on, its ASCII letters compared in lower case (a
    needle is given so); None when it cannot be read. A piece at a time, each overlapping
    the one before by a needle's length, up to the first piece that holds one."""
    overlap = max([_PATTERN_REACH, *(len(n) for n in needles if isinstance(n, bytes))]) - 1
    search = _searcher(needles)
    size = max(_PIECE, 2 * overlap)  # each piece moves on, however long a needle
    at = start
    while True:
        piece = read_span(path, at, size)
        if piece is None:
            return None
        if search(piece.lower()):
            return True
        if len(piece) < size:
            return False
        at += len(piece) - overlap


def _searcher(needles: Sequence[bytes | re.Pattern[bytes]]) -> Callable[[bytes], bool]:
    """A test of whether a piece holds any of ``needles``. Each search is a pass over the
    piece: needles that start with the same byte (``!pin``, ``!unpin``...) share one, which
    stops at each of that byte's places, up to ``_SHARED_STOPS`` of them (then each needle
    of the group has a pass of its own: a piece of ``!!!!`` costs what it did before)."""
    if any(isinstance(n, bytes) and not n for n in needles):
        return lambda piece: True  # an empty needle is in every piece
    groups: dict[int, list[bytes]] = {}
    for n in needles:
        if isinstance(n, bytes):
            groups.setdefault(n[0], []).append(n)
    shared = [(bytes((first,)), tuple(n[1:] for n in group), group)
              for first, group in groups.items() if len(group) > 1]
    alone = [group[0] for group in groups.values() if len(group) == 1]
    patterns = [n for n in needles if not isinstance(n, bytes)]

    def holds(piece: bytes) -> bool:
        for first, rests, group in shared:
            at, stops = piece.find(first), 0
            while at >= 0:
                if piece.startswith(rests, at + 1):
                    return True
                stops += 1
                if stops > _SHARED_STOPS:
                    if any(n in piece for n in group):
                        return True
                    break
                at = piece.find(first, at + 1)
        return any(n in piece for n in alone) \
            or any(p.search(piece) is not None for p in patterns)
    return holds

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
from collections.abc import Sequence

__all__ = ["file_holds_any", "read_span"]

_PIECE = 1 << 20  # bytes searched at a time: a transcript may be gigabytes
_PATTERN_REACH = 16  # the longest match a pattern given to ``file_holds_any`` may have


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
    at = start
    while True:
        piece = read_span(path, at, _PIECE)
        if piece is None:
            return None
        low = piece.lower()
        if any(n in low if isinstance(n, bytes) else n.search(low) is not None
               for n in needles):
            return True
        if len(piece) < _PIECE:
            return False
        at += len(piece) - overlap

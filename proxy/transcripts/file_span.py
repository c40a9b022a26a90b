"""One span of a file's bytes, read with the fewest system calls.

A worker thread reads transcripts while the event loop runs Python. Every system call lets go
of the interpreter's lock, and getting it back from a busy loop takes up to the switch
interval. A buffered ``open(...).read()`` makes eight calls (open, fstat, ioctl, two seeks, two
reads, close); this makes three.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["read_span"]


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

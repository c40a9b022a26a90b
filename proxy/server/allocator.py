"""Large blocks of memory go back to the system when they are freed (glibc's malloc).

glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes with a mapping of its own, and
unmaps it when it is freed. The threshold starts at 128 KiB but rises to the size of every
such block freed (up to 32 MiB): after the first large request body, every later body, its
text and the parser's buffers come from the heaps instead, whose free space glibc keeps and
which each worker thread grows apart. Measured with tests/bench/hostile_load.py
(docs/benchmarks.md, "Hostile load"): RSS stayed near the fuzz's peak after it ended, and
the peak itself was ~90 MB higher. With the threshold set (which also keeps it from moving),
a block of 1 MiB or more is mapped, and given back when freed; the price is a page fault
per 4 KiB the first time such a block is written, less than copying the same bytes.
Elsewhere (musl, macOS) the C library's own policy stands.
"""

from __future__ import annotations

import ctypes
import logging

__all__ = ["LARGE_BLOCK", "give_back_large_blocks"]

log = logging.getLogger("tailfloor")

LARGE_BLOCK = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def give_back_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Have blocks of ``threshold`` bytes or more mapped on their own; whether it was set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not done:
        log.debug("the C library keeps its own threshold for mapped memory blocks")
    return done

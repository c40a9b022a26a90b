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

Smaller blocks come from the heaps, and a heap gives back only the free space at its top:
pages freed in its middle stay resident. Under a thousand agents' load that free space grew
from 7 to 32 MB in seven minutes while the memory in use fell (glibc's ``mallinfo2``,
docs/benchmarks.md, "A thousand agents"), a slope of RSS that is no memory held.
``malloc_trim(0)`` hands those pages back; ``trim_after_work`` asks for it once a minute,
in a worker thread, and only after a minute in which the process did some work, so an idle
process pays nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LARGE_BLOCK", "TRIM_EVERY", "give_back_large_blocks", "return_free_pages",
           "trim_after_work"]

log = logging.getLogger("tailfloor")

LARGE_BLOCK = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
TRIM_EVERY = 60.0
# CPU seconds in a minute below which there is nothing worth trimming: an idle process
# spends ~0.05 s a minute (the watcher's and the key files' looks), one request ~5 ms.
_WORK_WORTH_A_TRIM = 0.5


@functools.cache
def _c_function(name: str, *argtypes: type[Any]) -> Callable[..., int] | None:
    """``name`` in the process's own C library, looked up once; None where it has none
    (``malloc_trim`` on musl and macOS) or ctypes cannot load it."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    return function  # type: ignore[no-any-return]


def give_back_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Have blocks of ``threshold`` bytes or more mapped on their own; whether it was set."""
    mallopt = _c_function("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is None:
        return False
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not done:
        log.debug("the C library keeps its own threshold for mapped memory blocks")
    return done


def _malloc_trim() -> Callable[..., int] | None:
    return _c_function("malloc_trim", ctypes.c_size_t)


def return_free_pages() -> bool:
    """glibc's ``malloc_trim(0)``: free pages inside the heaps go back to the system.

    Whether any did. ctypes lets go of the interpreter lock for the call, which walks the
    heaps' free lists (1-11 ms measured under load); it holds each heap's own lock
    meanwhile, so a ``malloc`` of another thread (the event loop's) may wait for it."""
    trim = _malloc_trim()
    return trim is not None and bool(trim(0))


async def trim_after_work(every: float = TRIM_EVERY,
                          trim: Callable[[], bool] | None = None,
                          cpu: Callable[[], float] = time.process_time,
                          worth: float = _WORK_WORTH_A_TRIM) -> None:
    """Every ``every`` seconds, if the process used ``worth`` CPU seconds since the look
    before, ``trim`` in a worker thread. Runs until cancelled; ends at once where the C
    library cannot trim."""
    if trim is None:
        if _malloc_trim() is None:
            log.debug("the C library cannot give free heap pages back")
            return
        trim = return_free_pages
    last = cpu()
    while True:
        await asyncio.sleep(every)
        now, before = cpu(), last
        # Per minute, not since the last trim: an idle process's few looks a minute never
        # add up to a trim.
        last = now
        if now - before >= worth:
            await asyncio.to_thread(trim)

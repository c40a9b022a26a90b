"""Blocking work (disk, database, heavy counting) in a bounded pool of worker threads.

Requests await it; the event loop stays free for every other request. The pool bounds how
much such work runs at once; a request beyond it waits its turn in the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

__all__ = ["WorkerPool"]

T = TypeVar("T")


class WorkerPool:
    def __init__(self, workers: int = 4, name: str = "tailfloor-work") -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

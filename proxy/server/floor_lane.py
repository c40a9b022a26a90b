"""The floor's decisions: a thread of their own, and a bound on how long a request waits.

A decision that reads transcripts runs off the event loop. It used to share the worker pool
(four threads) with the rest of the heavy work: a burst of cold restores (a thousand
agents' first requests after a start, nothing kept yet) then ran four at a time, each
slowed by the others' turns at the interpreter lock, and the event loop got it a fifth of
the time; every agent waited, half of them half a second or more (docs/benchmarks.md, "A
thousand agents"). One thread takes them in the order they came: the same work, each
decision done as soon as it can be, the loop contending with one thread only.

A request waits at most ``wait`` seconds for its decision to start; past that it goes
upstream as it came and says so (``none; reason=busy``, counted), and its decision is
dropped from the queue. A decision that has started is waited for: what is left is the
request's own work, which a lone agent always waited for (its first restore after a
compaction is never passed through for being slow). At most ``backlog`` decisions are
queued (a dropped one until the thread skips it): beyond that a request is passed on at
once, so the queue and what it holds stay bounded however fast requests come.

A decision that runs past ``slow`` seconds (5) holds every request behind it: a waiting
request logs a warning with where the lane's thread is (its stack: file, line and function
names, none of a message's text), again each minute while it runs, so a decision stuck in a
loop or on a lock says where.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

__all__ = ["BACKLOG", "FloorLane"]

A = TypeVar("A")
R = TypeVar("R")
BACKLOG = 256  # queued decisions; each holds its request's parsed context until it runs
SLOW = 5.0  # seconds a decision runs before a request waiting on the lane reports it
REPORT_EVERY = 60.0  # seconds between reports of the same decision
_STACK_FRAMES = 16
_QUEUED, _RUNNING, _DROPPED = 0, 1, 2
log = logging.getLogger("tailfloor.floor")


class _Job(Generic[A, R]):
    __slots__ = ("arg", "fn", "reported", "started", "state", "thread")

    def __init__(self, fn: Callable[[A], R], arg: A) -> None:
        self.fn: Callable[[A], R] | None = fn
        self.arg: A | None = arg
        self.state = _QUEUED
        self.thread = 0  # the lane thread's ident once it runs
        self.started = self.reported = 0.0


class FloorLane:
    def __init__(self, wait: float | None, backlog: int = BACKLOG,
                 name: str = "tailfloor-floor", slow: float = SLOW) -> None:
        """``wait``: seconds a request waits for its decision to start (None: no bound)."""
        self.wait = wait
        self.backlog = backlog
        self.slow = max(slow, 0.01)
        self.queued = 0  # jobs in the thread's queue, dropped ones included
        self._running: _Job[Any, Any] | None = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def decide(self, fn: Callable[[A], R], arg: A) -> R | None:
        """``fn(arg)`` in the lane's thread; None when it had not started within ``wait``
        or the queue is full (the caller passes the request through)."""
        with self._lock:
            if self.wait is not None and self.queued >= self.backlog:
                return None
            self.queued += 1
        job = _Job(fn, arg)
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._run, job)
        future.add_done_callback(_retrieve)
        try:
            return await self._awaited(job, future)
        except asyncio.CancelledError:  # the client left: nobody wants this decision
            self._drop(job)
            raise

    async def _awaited(self, job: _Job[A, R], future: asyncio.Future[R | None]) -> R | None:
        """The decision's result, or None when it had not started within ``wait``. While
        waiting, a decision that has run past ``slow`` seconds (this request's or the one
        before it) is reported: polled every quarter of ``slow``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait if self.wait is not None else None
        while True:
            period = self.slow / 4
            if deadline is not None:
                period = min(period, max(0.0, deadline - loop.time()))
            done, _pending = await asyncio.wait((future,), timeout=period)
            if done:
                return future.result()
            self._report_slow()
            if deadline is not None and loop.time() >= deadline:
                deadline = None
                if self._drop(job):
                    return None
                # Started: what is left is this request's own work, as it was before the
                # lane (the wait bounds the queue, never a decision's own cost).

    def _report_slow(self) -> None:
        now = time.monotonic()
        with self._lock:  # the frame too: the job it names is the one running
            job = self._running
            if job is None or now - job.started < self.slow \
                    or (job.reported and now - job.reported < REPORT_EVERY):
                return
            job.reported, queued = now, self.queued
            frame = sys._current_frames().get(job.thread)
            stack = traceback.format_stack(frame)[-_STACK_FRAMES:] if frame else []
        log.warning("a floor decision has run for %.1f s (%d queued behind it)",
                    now - job.started, queued, extra={"stack": "".join(stack)})

    def _drop(self, job: _Job[A, R]) -> bool:
        """Drop ``job`` if it has not started; whether it was dropped."""
        with self._lock:
            if job.state != _QUEUED:
                return False
            job.state = _DROPPED
            job.fn = job.arg = None  # the request's context need not wait in the queue
            return True

    def _run(self, job: _Job[A, R]) -> R | None:
        with self._lock:
            self.queued -= 1
            fn, arg = job.fn, job.arg
            if job.state == _DROPPED or fn is None:
                return None
            job.state, job.thread, job.started = _RUNNING, threading.get_ident(), time.monotonic()
            self._running = job
        try:
            return fn(arg)  # type: ignore[arg-type]  # arg is set while fn is
        finally:
            with self._lock:
                self._running = None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A decision nobody awaits any more must not log "exception never retrieved".
    if not future.cancelled():
        future.exception()

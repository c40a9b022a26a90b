"""The live transcript view for the server: initial scan, then follow changes.

Wiring (aiohttp)::

    service = TranscriptService(settings.sessions or default_roots(os.environ, Path.home()),
                                metrics)
    await service.start()   # scan, then watch (or: service.begin(), then serve at once)
    ...                     # service.catalog, service.sessions_summary()
    await service.stop()

Every file and database read (the scan, each batch of changes) runs in the service's own
worker thread, one batch after the other, never on the event loop; the catalog is safe for
the requests that query it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TypeVar

from proxy.metrics import Metrics
from proxy.transcripts.catalog import DEFAULT_CACHE_BYTES, Catalog
from proxy.transcripts.records import SourceKind
from proxy.transcripts.render import RenderOptions
from proxy.transcripts.tracker import Tracker
from proxy.transcripts.watch import watch_batches

__all__ = ["ErrorLog", "TranscriptService"]

T = TypeVar("T")

log = logging.getLogger(__name__)
ROOT_POLL = 1.0  # seconds between checks for roots that appeared or were created again
RESTART_BACKOFF = (0.5, 30.0)  # first and longest wait before a failed watcher restarts
WATCHER_GRACE = 30.0  # readiness fails once the watcher has been down this long
HEALTHY_AFTER = 5.0  # a restarted watcher counts as up after running this long (or a batch)
WATCH_SETUP = 10.0  # seconds the first scan waits for the watches to be in place
CATCH_UP_AFTER = 0.2  # seconds after a restart before catching up (its watches are set)
SOURCES: tuple[SourceKind, ...] = ("pi", "openclaw-jsonl", "openclaw-sqlite")


class ErrorLog:
    """Counts every transcript problem and logs it, at most once a minute per file and kind
    (a file that fills with garbage must not fill the log: the next line says how many more
    there were)."""

    def __init__(self, metrics: Metrics | None = None, cap: int = 20_000,
                 every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._cap = cap
        self._every = every
        self._clock = clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # -> (logged at, skipped)
        self.count = 0

    def __call__(self, kind: str, where: str, detail: str) -> None:
        self.count += 1
        if self._metrics is not None:
            self._metrics.transcript_errors.labels(kind=kind).inc()
        key = (kind, _POSITION.sub("", where))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self._every:
            self._last[key] = (last[0], last[1] + 1)
            return
        if last is None and len(self._last) >= self._cap:
            self._last.clear()  # a bound on memory: at worst a problem is logged again
        skipped = last[1] if last is not None else 0
        self._last[key] = (now, 0)
        more = f" ({skipped} more like it since the last line)" if skipped else ""
        log.warning("transcript %s at %s: %s%s", kind, where, detail, more)


_POSITION = re.compile(r" (?:@byte \d+|seq \d+)$")


class TranscriptService:
    """Follows every transcript under ``roots``; ``catalog`` is always a consistent view.

    The catalog is mutated only in the reader thread (one batch after the other); request
    handlers query it under its lock, which no mutation holds for long.
    """

    def __init__(self, roots: Sequence[Path], metrics: Metrics, tail_limit: int = 200, *,
                 startup_messages: int | None = 8, small_whole: bool = True,
                 tz: tzinfo | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 debounce_ms: int = 50, step_ms: int = 10, scan_workers: str = "auto") -> None:
        self.roots = [Path(r) for r in roots]
        self.metrics = metrics
        self.errors = ErrorLog(metrics)
        opts = RenderOptions(tz=tz) if tz is not None else RenderOptions(tz=_local_tz())
        self.catalog = Catalog(tail_limit, opts, cache_bytes)
        self._tracker = Tracker(self.roots, self.catalog, self.errors,
                                startup_messages=startup_messages, small_whole=small_whole,
                                scan_workers=scan_workers)
        self._debounce = debounce_ms
        self._step = step_ms
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._indexing: asyncio.Task[None] | None = None
        self._indexed = asyncio.Event()
        self._watching = asyncio.Event()  # the first watcher is set (or failed)
        # One reader thread: batches are applied in order, and never on the event loop.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailfloor-reader")
        self._scanned = False
        self._early: set[Path] = set()  # changes seen while the scan ran
        self.generation = 0
        self._lines_seen: dict[SourceKind, int] = {}
        self.changed_at = 0.0  # monotonic time of the last batch that changed a view
        self._down_since: float | None = None  # the watcher is down since (monotonic)
        self._waiters: list[asyncio.Future[None]] = []

    async def start(self) -> None:
        """``begin``, then wait until the first scan is done."""
        self.begin()
        await self.wait_indexed()

    def begin(self) -> None:
        """Start watching and indexing in the background and return at once: the server
        listens meanwhile (``indexed`` says when the first scan is done)."""
        if self._indexing is None:
            self._indexing = asyncio.create_task(self._index(), name="tailfloor-index")

    @property
    def indexed(self) -> bool:
        """Whether the first scan of the roots is done (and what changed during it applied)."""
        return self._indexed.is_set()

    async def wait_indexed(self) -> None:
        await self._indexed.wait()
        if self._indexing is not None and self._indexing.done():
            self._indexing.result()  # a failed start raises here, as it did before

    async def _index(self) -> None:
        """Watch, scan the roots (in the reader thread), then apply what changed during the
        scan. Nothing written after the watch began is missed."""
        try:
            # Directories are watched, never single files: a file root is watched through
            # its directory (renames and replacements are seen that way).
            found = await self._read(self._watched)
            log.info("transcript roots: %s (existing: %s)", [str(r) for r in self.roots],
                     [w for w, _identity in found])
            began = time.monotonic()
            self._task = asyncio.create_task(self._follow(found),
                                             name="tailfloor-transcripts")
            # The watches first (or the watcher's failure): then nothing written during
            # the scan is missed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._watching.wait(), WATCH_SETUP)
            await self._read(self._tracker.scan)
            self._scanned = True
            early, self._early = self._early, set()
            await self._apply(sorted(early))
            self._publish()
            log.info("transcripts ready: %d sessions in %.2fs", len(self.catalog),
                     time.monotonic() - began)
            if not len(self.catalog):  # what a newcomer meets when the agent writes elsewhere
                log.info("no transcript found under %s: point --sessions (TAILFLOOR_SESSIONS) "
                         "at the directory your agent writes its sessions to (`tailfloor "
                         "doctor` checks)", ", ".join(str(r) for r in self.roots))
        except Exception:
            log.exception("the first transcript scan failed; following changes from here")
            self.errors("internal", "scan", "failed")
            raise
        finally:
            self._indexed.set()

    async def stop(self) -> None:
        self._stop.set()
        if self._indexing is not None and not self._indexing.done():
            # The scan in the reader thread runs to its end; what follows it need not.
            self._indexing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._indexing
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 2.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            self._task = None
        await self._read(self._close_databases)
        self._reader.shutdown(wait=False, cancel_futures=True)

    def _close_databases(self) -> None:
        for state in self._tracker.dbs.values():
            state.db.close()

    def active(self, within: float) -> bool:
        """Whether a transcript changed in the last ``within`` seconds (an agent is at work)."""
        return self.changed_at > 0 and time.monotonic() - self.changed_at < within

    async def next_change(self, within: float) -> bool:
        """Wait (at most ``within`` s) for the next batch of changes; whether one came."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, within)
            return True
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def sessions_summary(self) -> list[dict[str, object]]:
        """Metadata of every session, newest first (no message content)."""
        return [r.summary() for r in self.catalog.sessions()]

    async def _read(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._reader, fn, *args)

    def _watched(self) -> list[tuple[str, tuple[int, int]]]:
        """The directories to watch (a file root through its directory) that exist now, with
        their identity: a root deleted and created again is another directory. Stats the
        roots: run it in the reader thread."""
        out = {}
        for root in self.roots:
            with contextlib.suppress(OSError):
                where = root.parent if root.is_file() else root
                st = where.stat()
                out[str(where)] = (st.st_dev, st.st_ino)
        return sorted(out.items())

    def watcher_ok(self, grace: float = WATCHER_GRACE) -> bool:
        """False once the watcher has been down for longer than ``grace`` seconds."""
        return self._down_since is None or time.monotonic() - self._down_since < grace

    async def _follow(self, watched: list[tuple[str, tuple[int, int]]]) -> None:
        """Supervise the watcher: restart it with a backoff when it fails or ends by itself,
        and follow roots that appear (or are created again) later; catch up after each."""
        delay = RESTART_BACKOFF[0]
        catch_up = False
        self.metrics.watcher_up.set(1)
        while not self._stop.is_set():
            try:
                reason = await self._watch(watched, catch_up=catch_up)
            except Exception:  # a bug in the supervision itself: counted, and on we go
                log.exception("transcript watcher supervision failed")
                reason = "error"
            if self._stop.is_set():
                return
            if reason == "roots":
                delay = RESTART_BACKOFF[0]
            else:
                self._down()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                delay = min(delay * 2, RESTART_BACKOFF[1])
            self.metrics.watcher_restarts.labels(reason=reason).inc()
            try:
                watched = await self._read(self._watched)
            except Exception:
                log.exception("transcript roots could not be listed")
                watched = []
            log.info("transcript watcher restarted (%s); watching %s", reason,
                     [w for w, _identity in watched])
            catch_up = self._scanned

    def _down(self) -> None:
        self._watching.set()  # the first scan waits no more for a watcher that failed
        if self._down_since is None:
            self._down_since = time.monotonic()
        self.metrics.watcher_up.set(0)

    def _up(self) -> None:
        self._down_since = None
        self.metrics.watcher_up.set(1)

    async def _watch(self, watched: list[tuple[str, tuple[int, int]]], *,
                     catch_up: bool = False) -> str:
        """Run one watcher until stop, a change of the roots ("roots"), a failure ("error")
        or its end on its own ("ended"). It counts as up once it delivered a batch or ran for
        HEALTHY_AFTER seconds (a watcher that fails at once stays down for readiness); what
        changed while none ran is caught up once it watches."""
        until = asyncio.Event()
        began = time.monotonic()
        side = [asyncio.create_task(self._roots_changed(watched, until, began))]
        if catch_up:
            side.append(asyncio.create_task(self._catch_up(after=CATCH_UP_AFTER)))
        try:
            if not watched:
                self._up()
                self._watching.set()
                await until.wait()
            else:
                async for batch in watch_batches([w for w, _identity in watched], until,
                                                 debounce_ms=self._debounce,
                                                 step_ms=self._step,
                                                 on_watching=self._watching.set):
                    self._up()
                    if self._scanned:
                        await self._apply([Path(p) for p in batch])
                    else:
                        self._early.update(Path(p) for p in batch)
                    if any(w in batch for w, _identity in watched):
                        # A root itself changed (deleted, replaced): a directory created
                        # again may reuse the old inode number, so do not wait for the poll.
                        until.set()
        except Exception:  # the watcher must never take the server down: restarted
            log.exception("transcript watcher failed")
            return "error"
        finally:
            for task in side:
                task.cancel()
            for task in side:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._stop.is_set():
            return "stopped"
        return "roots" if until.is_set() else "ended"

    async def _roots_changed(self, watched: list[tuple[str, tuple[int, int]]],
                             until: asyncio.Event, began: float) -> None:
        """Set ``until`` at stop or when the set of existing roots is no longer ``watched``;
        the watcher counts as up once it has run for HEALTHY_AFTER seconds."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), ROOT_POLL)
            if time.monotonic() - began >= HEALTHY_AFTER:
                self._up()
            try:
                now = await self._read(self._watched)
            except Exception:
                now = watched  # cannot tell: keep watching what we watch
            if self._stop.is_set() or now != watched:
                until.set()
                return

    async def _catch_up(self, after: float = 0.0) -> None:
        """What changed while no watcher ran (or in a root that just appeared): ``after``
        seconds, once the new watcher is in place, so nothing falls between the two."""
        await asyncio.sleep(after)
        try:
            await self._read(self._tracker.resync)
        except Exception:
            log.exception("transcript catch-up failed")
            self.errors("internal", "catch-up", "skipped")
            return
        self.changed_at = time.monotonic()
        self._publish()

    async def _apply(self, paths: list[Path]) -> None:
        if not paths:
            return
        try:
            lags = await self._read(self._batch, paths)
        except Exception:  # one bad batch must not stop following the others
            log.exception("transcript update failed")
            self.errors("internal", "update", "batch skipped")
            return
        for lag in lags:
            self.metrics.transcript_lag.observe(lag)
        if lags:
            self.changed_at = time.monotonic()
        self._publish()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _batch(self, paths: list[Path]) -> list[float]:
        """Apply one batch (reader thread); the lag of each changed file that was read."""
        if not self._tracker.changed(paths):
            return []
        now = time.time()
        lags = []
        for path in paths:
            with contextlib.suppress(OSError):
                lag = now - os.stat(path).st_mtime
                if 0 <= lag < 3600:
                    lags.append(lag)
        return lags

    def _publish(self) -> None:
        counts: dict[str, int] = dict.fromkeys(SOURCES, 0)
        counts.update(self.catalog.count_by_source())
        for source, n in counts.items():
            self.metrics.sessions.labels(source=source).set(n)
        for source, total in self._tracker.lines.items():
            delta = total - self._lines_seen.get(source, 0)
            if delta > 0:
                self.metrics.transcript_lines.labels(source=source).inc(delta)
            self._lines_seen[source] = total
        self.generation += 1  # batches applied so far: tests and benchmarks poll it


def _local_tz() -> tzinfo:
    # OpenClaw stamps user text in the host's timezone unless configured otherwise.
    return datetime.now().astimezone().tzinfo or UTC

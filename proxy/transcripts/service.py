"""The live transcript view for the server: initial scan, then follow changes.

Wiring (aiohttp)::

    service = TranscriptService(settings.sessions or default_roots(os.environ, Path.home()),
                                metrics)
    await service.start()   # scan (in a worker thread), then watch
    ...                     # service.catalog, service.sessions_summary()
    await service.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from proxy.metrics import Metrics
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.records import SourceKind
from proxy.transcripts.render import RenderOptions
from proxy.transcripts.tracker import Tracker
from proxy.transcripts.watch import watch_batches

__all__ = ["ErrorLog", "TranscriptService"]

log = logging.getLogger(__name__)
SOURCES: tuple[SourceKind, ...] = ("pi", "openclaw-jsonl", "openclaw-sqlite")


class ErrorLog:
    """Logs and counts each transcript problem once per (kind, location)."""

    def __init__(self, metrics: Metrics | None = None, cap: int = 20_000) -> None:
        self._metrics = metrics
        self._seen: set[tuple[str, str]] = set()
        self._cap = cap
        self.count = 0

    def __call__(self, kind: str, where: str, detail: str) -> None:
        key = (kind, where)
        if key in self._seen:
            return
        if len(self._seen) < self._cap:
            self._seen.add(key)
        self.count += 1
        if self._metrics is not None:
            self._metrics.transcript_errors.labels(kind=kind).inc()
        log.warning("transcript %s at %s: %s", kind, where, detail)


class TranscriptService:
    """Follows every transcript under ``roots``; ``catalog`` is always a consistent view.

    The catalog is only mutated on the event loop (batches are applied synchronously), so
    request handlers may query it without locks.
    """

    def __init__(self, roots: Sequence[Path], metrics: Metrics, tail_limit: int = 200, *,
                 startup_messages: int | None = 8, small_whole: bool = True,
                 tz: tzinfo | None = None,
                 debounce_ms: int = 50, step_ms: int = 10) -> None:
        self.roots = [Path(r) for r in roots]
        self.metrics = metrics
        self.errors = ErrorLog(metrics)
        opts = RenderOptions(tz=tz) if tz is not None else RenderOptions(
            tz=_local_tz())
        self.catalog = Catalog(tail_limit, opts)
        self._tracker = Tracker(self.roots, self.catalog, self.errors,
                                startup_messages=startup_messages, small_whole=small_whole)
        self._debounce = debounce_ms
        self._step = step_ms
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._scanned = False
        self._early: set[Path] = set()  # changes seen while the scan ran
        self.generation = 0
        self._lines_seen: dict[SourceKind, int] = {}

    async def start(self) -> None:
        """Start watching, scan the roots (in a worker thread), then apply what changed
        during the scan. Nothing written after the watch began is missed."""
        # Directories are watched, never single files: a file root is watched through
        # its directory (renames and replacements are seen that way).
        found = sorted({str(r.parent if r.is_file() else r) for r in self.roots if r.exists()})
        log.info("transcript roots: %s (existing: %s)", [str(r) for r in self.roots], found)
        began = time.monotonic()
        self._task = asyncio.create_task(self._follow(found), name="tailfloor-transcripts")
        for _ in range(3):  # let the task install its directory watches before the scan
            await asyncio.sleep(0)
        await asyncio.to_thread(self._tracker.scan)
        self._scanned = True
        early, self._early = self._early, set()
        self._apply(sorted(early))
        self._publish()
        log.info("transcripts ready: %d sessions in %.2fs", len(self.catalog),
                 time.monotonic() - began)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 2.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            self._task = None
        for state in self._tracker.dbs.values():
            state.db.close()

    def sessions_summary(self) -> list[dict[str, object]]:
        """Metadata of every session, newest first (no message content)."""
        return [r.summary() for r in self.catalog.sessions()]

    async def wait_for(self, predicate: Callable[[], bool], within: float = 1.0) -> bool:
        """Wait until ``predicate()`` holds after some batch is applied (False on timeout)."""
        async def until() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)
        try:
            await asyncio.wait_for(until(), within)
        except TimeoutError:
            return predicate()
        return True

    async def wait_idle(self, quiet: float = 0.15, within: float = 2.0) -> None:
        """Return once no batch was applied for ``quiet`` seconds (at most ``within``)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            gen = self.generation
            await asyncio.sleep(quiet)
            if gen == self.generation:
                return

    async def _follow(self, paths: list[str]) -> None:
        if not paths:
            await self._stop.wait()
            return
        try:
            async for batch in watch_batches(paths, self._stop, debounce_ms=self._debounce,
                                             step_ms=self._step):
                if self._scanned:
                    self._apply([Path(p) for p in batch])
                else:
                    self._early.update(Path(p) for p in batch)
        except Exception:  # the watcher must never take the server down
            log.exception("transcript watcher stopped; views will no longer update")

    def _apply(self, paths: list[Path]) -> None:
        if not paths:
            return
        try:
            touched = self._tracker.changed(paths)
        except Exception:  # one bad batch must not stop following the others
            log.exception("transcript update failed")
            self.errors("internal", "update", "batch skipped")
            return
        if touched:
            self._observe_lag(paths)
        self._publish()

    def _observe_lag(self, paths: list[Path]) -> None:
        now = time.time()
        for path in paths:
            with contextlib.suppress(OSError):
                lag = now - os.stat(path).st_mtime
                if 0 <= lag < 3600:
                    self.metrics.transcript_lag.observe(lag)

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
        self.generation += 1
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _local_tz() -> tzinfo:
    # OpenClaw stamps user text in the host's timezone unless configured otherwise.
    return datetime.now().astimezone().tzinfo or UTC

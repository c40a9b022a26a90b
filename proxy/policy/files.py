"""Rules from a directory, kept current: the file-reading adapter, the holder and the watcher.

The watcher follows the *directory*, not the files: a Kubernetes ConfigMap volume updates by
creating a new timestamped directory and swapping the ``..data`` symlink, so the files'
own inodes never change. Any change triggers a reload of the whole directory; a reload that
fails keeps the last good rules, logs every problem (file, rule, field) and is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.errors import unlinked
from proxy.policy.parse import RulesError, parse_rules
from proxy.policy.records import RuleSet, builtin_rules
from proxy.transcripts.watch import watch_batches

if TYPE_CHECKING:
    from proxy.metrics import Metrics

__all__ = ["RulesHolder", "load_rules_dir", "read_rule_files", "watch_rules"]

log = logging.getLogger(__name__)

DEBOUNCE_MS = 50
RETRY_SECONDS = 2.0


def read_rule_files(directory: Path) -> list[tuple[str, str]]:
    """``(file name, text)`` of every ``*.toml`` in ``directory``, sorted by name."""
    if not directory.is_dir():
        raise RulesError([f"{directory}: not a directory"])
    sources: list[tuple[str, str]] = []
    problems: list[str] = []
    for path in sorted(directory.glob("*.toml")):
        if path.name.startswith(".") or not path.is_file():
            continue
        try:
            sources.append((path.name, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{path.name}: cannot read: {exc}")
    if problems:
        raise RulesError(problems)
    return sources


def load_rules_dir(directory: Path) -> RuleSet:
    """Parse a rules directory; raises ``RulesError`` listing every problem."""
    return parse_rules(read_rule_files(directory))


class RulesHolder:
    """The rules in force. Readers take ``holder.rules`` per request; reloads swap it whole."""

    def __init__(self, directory: Path | None, metrics: Metrics | None = None) -> None:
        self.directory = directory
        self._metrics = metrics
        self._sources: list[tuple[str, str]] = []
        self.rules: RuleSet = builtin_rules()
        self.last_error: RulesError | None = None

    @classmethod
    def open(cls, directory: Path | None, metrics: Metrics | None = None) -> RulesHolder:
        """Load at start-up; a bad directory raises ``RulesError`` (the server must not start)."""
        holder = cls(directory, metrics)
        if directory is not None:
            holder._sources = read_rule_files(directory)
            holder.rules = parse_rules(holder._sources)
            log.info("rules loaded from %s (%d files, %d rules)", directory,
                     len(holder._sources), len(holder.rules.rules))
        return holder

    def reload(self) -> bool | None:
        """Re-read the directory: True = new rules, False = bad edit kept out, None = unchanged."""
        if self.directory is None:
            return None
        try:
            sources = read_rule_files(self.directory)
            if sources == self._sources:
                return None
            rules = parse_rules(sources)
        except RulesError as exc:
            self.last_error = unlinked(exc)
            for problem in exc.problems:
                log.error("rules reload rejected, keeping the previous rules: %s", problem)
            self._count("error")
            return False
        self._sources = sources
        self.rules = rules
        self.last_error = None
        log.info("rules reloaded from %s (%d files, %d rules)", self.directory,
                 len(sources), len(rules.rules))
        self._count("ok")
        return True

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.rules_reloads.labels(outcome=outcome).inc()


async def watch_rules(holder: RulesHolder, stop_event: asyncio.Event | None = None,
                      debounce_ms: int = DEBOUNCE_MS) -> None:
    """Reload ``holder`` whenever its directory changes, until ``stop_event`` is set.

    The transcripts' watcher (inotify's doorbell on Linux): a quiet rules directory costs
    no wake-up, where watchfiles' ``awatch`` looks every step (100 times a second)."""
    if holder.directory is None:
        return
    stop = stop_event or asyncio.Event()
    while not stop.is_set():
        try:
            # The first batch comes once the watch is set: a reload then sees every edit
            # made while no watch ran (since start-up's read, or since the watch broke). A
            # reload before the watch is set would miss an edit landing between the two.
            async for _changes in watch_batches([str(holder.directory)], stop,
                                                debounce_ms=debounce_ms, armed_batch=True):
                # Reading and parsing the files is disk work: never on the event loop.
                await asyncio.to_thread(holder.reload)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the directory vanished or the watcher broke: retry
            log.warning("watching rules directory %s failed (%s); retrying in %.0f s",
                        holder.directory, exc, RETRY_SECONDS)
            # Edits still apply while no watch can be set (every retry reads them).
            with contextlib.suppress(Exception):
                await asyncio.to_thread(holder.reload)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_SECONDS)

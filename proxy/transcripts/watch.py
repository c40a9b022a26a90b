"""watchfiles over directories, as batches of changed paths.

Directories are watched, never single files, so renames, new files and replaced databases
are all seen: the roots recursively, or, on Linux, every directory under them one by one
(the doorbell's list, which follows the directories that appear). ``debounce``/``step``
are small (50/10 ms by default) to keep the delay from a write to the updated view well
under 100 ms.

On Linux the Rust watcher is asked for its changes only when the inotify doorbell
(``doorbell.py``) rang: an idle process sleeps on a descriptor instead of waking every
``step`` ms. Elsewhere (or with ``WATCHFILES_FORCE_POLLING``, where inotify does not see
the writes) it is asked as watchfiles' ``awatch`` does, waking every ``rust_timeout`` ms to
honour a stop; those empty wake-ups are not passed on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence

from watchfiles._rust_notify import RustNotify

from proxy.transcripts.doorbell import Doorbell

__all__ = ["watch_batches"]

# Seconds between looks with the doorbell silent: only a safety net (an inotify descriptor
# does not lose events without ringing: an overflow rings too).
QUIET_LOOK = 60.0
# Rounds of new directories watched before a batch goes out without the latest ones.
NEW_DIRECTORY_ROUNDS = 3


def _nothing() -> None:
    return None


def _notify(paths: Sequence[str], bell: Doorbell | None, polling: bool) -> RustNotify:
    """The Rust watcher. With the doorbell it watches the doorbell's directories one by one,
    not the roots recursively: a recursive watch stats every file under the roots while
    holding the interpreter lock (0.18 s over 50,000 sessions, every thread stopped; one by
    one, 13 ms for their 501 directories). New directories are added as they appear."""
    if bell is None or bell.failed:  # the recursive watch says why it fails, if it does
        return RustNotify(list(paths), False, polling, 300, True, True)
    dirs = [d for d in bell.directories() if os.path.isdir(d)]
    return RustNotify(dirs, False, False, 300, False, True)


class _Stopped(Exception):
    """The watch was asked to stop while the Rust watcher waited."""


def _changed(changes: object) -> set[str]:
    """The paths in what the Rust watcher returned."""
    if changes == "stop":
        raise _Stopped
    if changes == "signal":
        raise RuntimeError("the watch thread unexpectedly received a signal")
    return {path for _change, path in changes} if isinstance(changes, set) else set()


def _unwatched(bell: Doorbell, found: set[str]) -> list[str]:
    """The directories among the changed paths that the doorbell does not watch yet (disk
    work: off the loop). A link to a directory is not followed, as the doorbell does not."""
    known = set(bell.directories())
    return sorted(p for p in found
                  if p not in known and os.path.isdir(p) and not os.path.islink(p))


async def watch_batches(paths: Sequence[str], stop: asyncio.Event, *, debounce_ms: int = 50,
                        step_ms: int = 10, rust_timeout_ms: int = 200,
                        on_watching: Callable[[], None] = _nothing, armed_batch: bool = False
                        ) -> AsyncIterator[set[str]]:
    """Yield the set of changed paths per batch until ``stop`` is set; ``on_watching`` is
    called once every change from then on is sure to be seen. ``armed_batch``: an empty
    batch is yielded then too, so a caller that reads what it watches on every batch misses
    no change made before the watch was set."""
    polling = bool(os.environ.get("WATCHFILES_FORCE_POLLING"))
    bell = None if polling else Doorbell.open()
    watcher = newer = None
    try:
        if bell is not None:
            # The doorbell first: what changes once the Rust watcher is set is sure to ring.
            await asyncio.to_thread(bell.watch_trees, paths)
        watcher = await asyncio.to_thread(_notify, paths, bell, polling)
        on_watching()
        if armed_batch:
            yield set()
        carry: list[str] = []  # new directories to watch before the next batch
        while not stop.is_set():
            found: set[str] = set(carry)
            if not carry:
                timeout = rust_timeout_ms
                appeared: list[str] = []
                if bell is not None:
                    appeared = await bell.rung(stop, QUIET_LOOK) or []
                    if stop.is_set():
                        return
                    # Changes are gathered by now or within a step: wait for them to settle,
                    # or a short while when the ring was for nothing reported.
                    timeout = debounce_ms + 2 * step_ms
                changes = await asyncio.to_thread(watcher.watch, debounce_ms, step_ms,
                                                  timeout, stop)
                found = _changed(changes)
                found.update(appeared)
            # New directories, as the doorbell or the Rust watcher saw them appear (in a storm
            # the doorbell's queue overflows and loses some): watched, and a Rust watcher
            # made with them, before the batch goes out. A file written in one before that
            # is found when the tracker walks it (it is in the batch); every later change is
            # the new watcher's. (A recursive watcher, the doorbell's fallback, follows them
            # by itself.) Directories made while the new watcher replaced the old one are in
            # what the old one reports meanwhile (``rest``): watched in turn, for a few
            # rounds; past them, the batch goes out without them and the next one starts by
            # watching them, so a steady stream of new directories holds no batch back.
            fresh = carry or (await asyncio.to_thread(_unwatched, bell, found)
                              if bell is not None and not bell.failed else [])
            carry = []
            for _round in range(NEW_DIRECTORY_ROUNDS + 1):
                if bell is None or not fresh:
                    break
                if _round == NEW_DIRECTORY_ROUNDS:
                    found.difference_update(fresh)  # walked once they are watched
                    carry = fresh
                    break
                await asyncio.to_thread(bell.watch_trees, fresh)
                newer = await asyncio.to_thread(_notify, paths, bell, polling)
                rest = await asyncio.to_thread(watcher.watch, debounce_ms, step_ms,
                                               debounce_ms + 2 * step_ms, stop)
                watcher.close()
                watcher, newer = newer, None
                later = _changed(rest)
                found.update(later)
                fresh = await asyncio.to_thread(_unwatched, bell, later) \
                    if not bell.failed else []
            if found:
                yield found
    except _Stopped:
        return
    finally:
        for made in (watcher, newer):
            if made is not None:
                made.close()
        if bell is not None:
            bell.close()

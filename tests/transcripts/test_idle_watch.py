"""An idle watcher does not wake: the Rust watcher is asked for changes only when inotify
rang (proxy/transcripts/doorbell.py), never polled every step.

The count is of operations, not time: the Rust watcher looks at its stop event once per
step while it is asked for changes, so the number of those looks over a quiet second is
the number of times the process woke for nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from watchfiles._rust_notify import RustNotify

from proxy.transcripts import watch
from proxy.transcripts.doorbell import EVENT_HEAD, IN_CREATE, IN_ISDIR, IN_MODIFY, events
from tests.transcripts.waiting import following


class CountedStop(asyncio.Event):
    """A stop event that counts how often a watcher looks at it: once per step while it
    polls, so the looks over a quiet second are its wake-ups for nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        return super().is_set()


async def _next(batches: asyncio.Queue[set[str]], within: float) -> set[str]:
    return await asyncio.wait_for(batches.get(), within)


async def test_a_quiet_watcher_does_not_wake_and_still_sees_every_change(
        tmp_path: Path) -> None:
    stop = CountedStop()
    task, batches = following(tmp_path, stop)
    try:
        await asyncio.sleep(0.3)  # set up
        before = stop.looks
        await asyncio.sleep(1.0)
        # Polling every 10 ms looks ~100 times a second; the doorbell not once.
        assert stop.looks - before <= 2

        began = time.monotonic()
        (tmp_path / "a.jsonl").write_text("{}\n")
        assert str(tmp_path / "a.jsonl") in await _next(batches, 2.0)
        assert time.monotonic() - began < 0.5

        # A new directory is watched as soon as it appears: what is written in it later
        # rings too.
        (tmp_path / "new").mkdir()
        await _next(batches, 2.0)
        await asyncio.sleep(0.2)
        (tmp_path / "new" / "b.jsonl").write_text("{}\n")
        seen: set[str] = set()
        while str(tmp_path / "new" / "b.jsonl") not in seen:
            seen |= await _next(batches, 2.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)


def test_inotify_events_are_read_whole_names_and_masks() -> None:
    def event(wd: int, mask: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name)) if name else b""
        return EVENT_HEAD.pack(wd, mask, 0, len(padded)) + padded

    data = event(1, IN_MODIFY, b"s.jsonl") + event(2, IN_CREATE | IN_ISDIR, b"dir") \
        + event(3, IN_MODIFY, b"")
    assert list(events(data)) == [(1, IN_MODIFY, "s.jsonl"), (2, IN_CREATE | IN_ISDIR, "dir"),
                                  (3, IN_MODIFY, "")]


async def test_the_rust_watcher_never_walks_the_files_under_the_roots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A recursive watch stats every file under the roots while it holds the interpreter
    # lock (0.18 s over 50,000 sessions: every thread stopped, /healthz included). Oracle:
    # what the Rust watcher is asked to watch, each time one is made.
    made: list[tuple[list[str], bool]] = []

    def recording(paths: list[str], *args: Any) -> RustNotify:
        made.append((sorted(paths), args[3]))  # (debug, polling, delay, recursive, ...)
        return RustNotify(paths, *args)

    monkeypatch.setattr(watch, "RustNotify", recording)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for n in range(20):
            (tmp_path / name / f"s{n}.jsonl").write_text("{}\n")
    stop = asyncio.Event()
    task, batches = following(tmp_path, stop)
    try:
        await asyncio.sleep(0.3)
        assert made == [([str(tmp_path), str(tmp_path / "a"), str(tmp_path / "b")], False)]
        # a directory in a new one, a file written in it at once, one more a moment later
        (tmp_path / "c" / "d").mkdir(parents=True)
        (tmp_path / "c" / "d" / "first.jsonl").write_text("{}\n")
        seen: set[str] = set()
        while str(tmp_path / "c") not in seen:  # the tracker walks it (_with_new_dirs)
            seen |= await _next(batches, 2.0)
        await asyncio.sleep(0.2)
        (tmp_path / "c" / "d" / "later.jsonl").write_text("{}\n")
        while str(tmp_path / "c" / "d" / "later.jsonl") not in seen:
            seen |= await _next(batches, 2.0)
        assert made[-1] == (sorted(str(p) for p in (tmp_path, tmp_path / "a", tmp_path / "b",
                                                     tmp_path / "c", tmp_path / "c" / "d")),
                            False)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)

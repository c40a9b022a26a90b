"""Directories that appear under a root are followed, whatever the timing.

The Rust watcher watches the doorbell's directories one by one (proxy/transcripts/watch.py),
so a directory the doorbell misses is missed for good, and the tracker must walk a directory
that appears, even one it tracked before it was deleted.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.transcripts import watch
from proxy.transcripts.catalog import Catalog
from proxy.transcripts.doorbell import Doorbell
from proxy.transcripts.tracker import Tracker
from tests.transcripts.waiting import following


def _session(folder: Path, sid: str) -> Path:
    path = folder / f"2026-11-30T03-00-00-000Z_{sid}.jsonl"
    header = {"type": "session", "version": 3, "id": sid, "timestamp": "2026-11-30T03:00:00Z",
              "cwd": "/w"}
    user = {"type": "message", "id": "u1", "parentId": None,
            "timestamp": "2026-11-30T03:00:01Z",
            "message": {"role": "user", "content": f"hello from {sid}"}}
    path.write_bytes(orjson.dumps(header) + b"\n" + orjson.dumps(user) + b"\n")
    return path


def test_a_directory_made_while_its_parent_is_being_watched_is_watched(tmp_path: Path) -> None:
    bell = Doorbell.open()
    assert bell is not None  # Linux: inotify
    parent = tmp_path / "a"
    parent.mkdir()
    real = bell._add

    def add(fd: int, path: bytes, mask: int) -> Any:
        if path == bytes(parent):  # made just before its parent's watch is set
            (parent / "b").mkdir()
        return real(fd, path, mask)

    bell._add = add
    try:
        bell.watch_trees([str(tmp_path)])
        assert sorted(bell.directories()) == [str(tmp_path), str(parent), str(parent / "b")]
    finally:
        bell.close()


def test_a_folder_deleted_and_made_again_is_walked(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    folder = root / "--home-a-project--"
    folder.mkdir(parents=True)
    first = _session(folder, "one")
    catalog = Catalog(20)
    tracker = Tracker([root], catalog, lambda *_p: None, scan_workers="0")
    tracker.scan()
    assert "one" in catalog
    shutil.rmtree(folder)
    tracker.changed([first, folder])
    assert "one" not in catalog
    folder.mkdir()
    _session(folder, "two")
    # only the directory is reported: its file was written before it was watched
    assert tracker.changed([folder]) == {"two"}
    assert "two" in catalog


async def test_a_directory_the_doorbell_lost_is_watched_from_the_rust_watchers_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a storm of new files the doorbell's inotify queue overflows and loses directory
    # creations; the Rust watcher still reports the directory (its parent is watched), and
    # what is written in it later must be seen. Here the doorbell loses every creation.
    monkeypatch.setattr(Doorbell, "_drain", _lost_every_creation)
    await _written_in_it_is_seen(tmp_path, (tmp_path / "new").mkdir, tmp_path / "new")


async def _written_in_it_is_seen(root: Path, make: Callable[[], None], folder: Path) -> None:
    """Following ``root``, ``make()`` then: ``folder`` is reported, and a file written in it
    after that too."""
    stop = asyncio.Event()
    task, batches = following(root, stop)
    try:
        await asyncio.sleep(0.3)
        make()
        seen: set[str] = set()
        while str(folder) not in seen:
            seen |= await asyncio.wait_for(batches.get(), 2.0)
        (folder / "later.jsonl").write_text("{}\n")
        while str(folder / "later.jsonl") not in seen:
            seen |= await asyncio.wait_for(batches.get(), 2.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)


_real_drain = Doorbell._drain


def _lost_every_creation(self: Doorbell) -> list[str] | None:
    found = _real_drain(self)
    return None if found is None else []  # it rang, but named no new directory


async def test_a_directory_made_while_the_watcher_is_replaced_is_watched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A new directory gets a new Rust watcher; the old one is read a last time, then closed.
    # A directory made in between is reported only by the old one's last read (the doorbell
    # loses every creation here, as it does some in a storm): it must be watched too, or
    # what is written in it after the tracker walked it is never seen.
    monkeypatch.setattr(Doorbell, "_drain", _lost_every_creation)
    real = watch._notify
    made: list[Path] = []

    def notify(paths: Any, bell: Any, polling: bool) -> Any:
        made_watcher = real(paths, bell, polling)
        if not made and (tmp_path / "first").is_dir():
            made.append(tmp_path / "late")
            made[0].mkdir()  # the new watcher is made, the old one not read yet
        return made_watcher

    monkeypatch.setattr(watch, "_notify", notify)
    await _written_in_it_is_seen(tmp_path, (tmp_path / "first").mkdir, tmp_path / "late")


async def test_a_steady_stream_of_new_directories_holds_no_batch_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A new directory every 20 ms for 3 s, each reported while the last one's watcher was
    # being made: a change elsewhere still goes out during the stream, and every directory
    # ends up watched (a file written in each afterwards is seen).
    monkeypatch.setattr(Doorbell, "_drain", _lost_every_creation)
    (tmp_path / "known").mkdir()
    stop = asyncio.Event()
    task, batches = following(tmp_path, stop)
    made: list[Path] = []

    async def stream_of_directories() -> None:
        for n in range(150):
            made.append(tmp_path / f"d{n}")
            made[-1].mkdir()
            await asyncio.sleep(0.02)

    try:
        await asyncio.sleep(0.3)
        making = asyncio.create_task(stream_of_directories())
        await asyncio.sleep(0.5)
        (tmp_path / "known" / "changed.jsonl").write_text("{}\n")
        seen: set[str] = set()
        while str(tmp_path / "known" / "changed.jsonl") not in seen:
            seen |= await asyncio.wait_for(batches.get(), 5.0)
        assert not making.done(), "the change waited for the stream of directories to end"
        await making
        # A directory goes out in a batch once it is watched (the tracker walks it then).
        while not {str(folder) for folder in made} <= seen:
            seen |= await asyncio.wait_for(batches.get(), 5.0)
        for folder in made:
            (folder / "later.jsonl").write_text("{}\n")
        wanted = {str(folder / "later.jsonl") for folder in made}
        while not wanted <= seen:
            try:
                seen |= await asyncio.wait_for(batches.get(), 5.0)
            except TimeoutError:
                raise AssertionError(f"never seen: {sorted(wanted - seen)[:5]}, "
                                     f"{len(wanted - seen)} in all") from None
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)

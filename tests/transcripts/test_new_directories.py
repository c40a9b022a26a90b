"""Directories that appear under a root are followed, whatever the timing.

The Rust watcher watches the doorbell's directories one by one (proxy/transcripts/watch.py),
so a directory the doorbell misses is missed for good, and the tracker must walk a directory
that appears, even one it tracked before it was deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson

from proxy.transcripts.catalog import Catalog
from proxy.transcripts.doorbell import Doorbell
from proxy.transcripts.tracker import Tracker


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

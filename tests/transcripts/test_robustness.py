"""Bad input is skipped, logged once with its location, counted; nothing crashes or stops."""

from __future__ import annotations

import json
import logging
import os
import shutil
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from proxy.metrics import Metrics
from proxy.transcripts import jsonl
from proxy.transcripts.service import TranscriptService
from tests.conftest import registry_sample
from tests.transcripts.conftest import CAPTURES, OC9_MAIN, PI_FILE, snapshot, writable_db
from tests.transcripts.waiting import until

PI_ID = "01a22a42-1ed4-778c-a542-c559c46de9e7"
HEADER = {"type": "session", "version": 3, "id": "s-1", "timestamp": "2026-11-30T03:00:00Z",
          "cwd": "/w"}


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _user(entry_id: str, parent: str | None, text: str) -> dict[str, Any]:
    return {"type": "message", "id": entry_id, "parentId": parent,
            "timestamp": "2026-11-30T03:00:01Z",
            "message": {"role": "user", "content": text, "timestamp": 1796007601000}}


def errors(metrics: Metrics, kind: str) -> float:
    return registry_sample(metrics.registry, "tailfloor_transcript_errors_total", kind=kind)


@pytest.fixture
def pi_dir(tmp_path: Path) -> Path:
    d = tmp_path / "root" / "--w--"
    d.mkdir(parents=True)
    return d


async def _service(root: Path, metrics: Metrics, **kw: Any) -> TranscriptService:
    svc = TranscriptService([root], metrics, tail_limit=20, tz=UTC, **kw)
    await svc.start()
    return svc


async def test_bad_lines_are_skipped_logged_once_and_counted(
        pi_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = pi_dir / "2026-11-30T03-00-00-000Z_s-1.jsonl"
    path.write_bytes(
        _line(HEADER) + _line(_user("e1", None, "first"))
        + b'{"type": "message", "id": "e2", broken\n'
        + b'{"type":"message","id":"e3","parentId":"e1",'
        + b'"message":{"role":"user","content":"\xff\xfe"}}\n'
        + _line({"type": "hologram", "id": "e4", "parentId": "e1"})
        + _line(_user("e5", "e1", "last good line")))
    before = snapshot([pi_dir])
    metrics = Metrics()
    caplog.set_level(logging.WARNING)
    svc = await _service(pi_dir.parent, metrics)
    try:
        tail = svc.catalog.tail("s-1", 10)
        assert [t.entry_id for t in tail] == ["e1", "e5"]
        assert errors(metrics, "malformed_json") == 1
        assert errors(metrics, "invalid_utf8") == 1
        assert errors(metrics, "unknown_type") == 1
        svc.catalog.context("s-1")
        svc.catalog.tail("s-1", 50)  # reading again does not log or count again
        assert errors(metrics, "malformed_json") == 1
        logged = [r.getMessage() for r in caplog.records if "malformed_json" in r.getMessage()]
        assert len(logged) == 1 and f"{path} @byte" in logged[0]
        assert snapshot([pi_dir]) == before  # reading never writes
        # the watcher keeps going after bad input
        with path.open("ab") as f:
            f.write(b"not json either\n" + _line(_user("e6", "e5", "after the bad ones")))
        assert await until(lambda: svc.catalog.tail("s-1", 1)[0].entry_id == "e6")
        assert errors(metrics, "malformed_json") == 2
    finally:
        await svc.stop()


async def test_line_over_16_mib_is_skipped(pi_dir: Path) -> None:
    path = pi_dir / "2026-11-30T03-00-00-000Z_s-1.jsonl"
    huge = _user("big", "e1", "x" * (16 * 1024 * 1024 + 10))
    path.write_bytes(_line(HEADER) + _line(_user("e1", None, "first")) + _line(huge)
                     + _line(_user("e2", "e1", "after the big one")))
    metrics = Metrics()
    svc = await _service(pi_dir.parent, metrics)
    try:
        assert [t.entry_id for t in svc.catalog.tail("s-1", 5)] == ["e1", "e2"]
        assert errors(metrics, "line_too_long") == 1
        with path.open("ab") as f:  # and while following
            f.write(_line(huge) + _line(_user("e3", "e2", "still following")))
        assert await until(lambda: svc.catalog.tail("s-1", 1)[0].entry_id == "e3", 2.0)
        assert errors(metrics, "line_too_long") == 2
    finally:
        await svc.stop()


async def test_bad_headers_and_missing_parent(pi_dir: Path) -> None:
    (pi_dir / "2026-11-30T03-00-00-000Z_a.jsonl").write_bytes(
        _line(_user("e1", None, "no header")))
    (pi_dir / "2026-11-30T03-00-00-000Z_b.jsonl").write_bytes(
        _line({**HEADER, "id": "b", "version": 99}) + _line(_user("e1", None, "x")))
    (pi_dir / "2026-11-30T03-00-00-000Z_c.jsonl").write_bytes(
        _line({**HEADER, "id": "c"}) + _line(_user("e1", None, "root"))
        + _line(_user("e2", "ghost", "orphan")))
    metrics = Metrics()
    svc = await _service(pi_dir.parent, metrics)
    try:
        assert [r.session_id for r in svc.catalog.sessions()] == ["c"]
        assert errors(metrics, "missing_header") == 1
        assert errors(metrics, "bad_version") == 1
        assert errors(metrics, "missing_parent") == 1
        # the branch ends at the dangling link: only the orphan is on it
        assert [t.entry_id for t in svc.catalog.tail("c", 5)] == ["e2"]
    finally:
        await svc.stop()


async def test_unreadable_file_and_symlink_outside(pi_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    locked = pi_dir / "2026-11-30T03-00-00-000Z_locked.jsonl"
    locked.write_bytes(_line({**HEADER, "id": "locked"}))
    os.chmod(locked, 0)

    def guarded(path: str, *args: Any, **kwargs: Any) -> Any:
        # root ignores file modes: refuse the way the kernel would for anyone else
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)  # the reader closes it

    monkeypatch.setattr(jsonl, "open", guarded, raising=False)  # the reader's own name
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_bytes(_line({**HEADER, "id": "outside"}) + _line(_user("e1", None, "hi")))
    (pi_dir / "2026-11-30T03-00-00-000Z_link.jsonl").symlink_to(outside)
    metrics = Metrics()
    svc = await _service(pi_dir.parent, metrics)
    try:
        assert len(svc.catalog) == 0
        assert errors(metrics, "permission") == 1
        assert errors(metrics, "outside_root") == 1
    finally:
        await svc.stop()
        os.chmod(locked, 0o644)


async def test_zstd_row_that_does_not_decompress(tmp_path: Path) -> None:
    root = tmp_path / "oc9"
    shutil.copytree(CAPTURES / "oc96-state", root)
    db = root / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    conn = writable_db(db)
    seq = conn.execute("SELECT seq FROM transcript_events WHERE session_id=? AND "
                       "event_zstd IS NOT NULL ORDER BY seq LIMIT 1", (OC9_MAIN,)).fetchone()[0]
    conn.execute("UPDATE transcript_events SET event_zstd=? WHERE session_id=? AND seq=?",
                 (b"\x28\xb5\x2f\xfd not a zstd frame", OC9_MAIN, seq))
    conn.close()
    before = snapshot([root])
    metrics = Metrics()
    svc = await _service(root, metrics, startup_messages=None)
    try:
        assert svc.catalog.get(OC9_MAIN) is not None
        assert errors(metrics, "zstd") == 1
        assert svc.catalog.context(OC9_MAIN)
    finally:
        await svc.stop()
    assert snapshot([root]) == before


async def test_watcher_survives_a_deleted_root_file(roots: dict[str, Path]) -> None:
    metrics = Metrics()
    svc = TranscriptService(list(roots.values()), metrics, tz=UTC)
    await svc.start()
    try:
        path = roots["pi"] / "--home-agent-pi-work--" / PI_FILE
        path.unlink()
        assert await until(lambda: svc.catalog.get(PI_ID) is None)
        path.write_bytes(_line({**HEADER, "id": "again"}) + _line(_user("e1", None, "x")))
        assert await until(lambda: svc.catalog.get("again") is not None)
    finally:
        await svc.stop()

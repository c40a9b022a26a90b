"""The service follows real transcripts live: appends, partial writes, resets, SQLite rows."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zstandard

from proxy.metrics import Metrics
from proxy.transcripts.service import TranscriptService
from tests.transcripts.conftest import (
    OC7_LIVE,
    OC7_OLD,
    OC9_MAIN,
    OC9_NEXT,
    PI_FILE,
    snapshot,
    writable_db,
)
from tests.transcripts.waiting import idle, until

PI_ID = "01a22a42-1ed4-778c-a542-c559c46de9e7"


@pytest.fixture
async def service(roots: dict[str, Path]) -> AsyncIterator[TranscriptService]:
    from datetime import UTC

    # small_whole=False: the recorded transcripts are small; follow them the way large
    # ones are followed (only the newest messages read at start).
    svc = TranscriptService(list(roots.values()), Metrics(), tail_limit=50, tz=UTC,
                            small_whole=False)
    await svc.start()
    yield svc
    await svc.stop()


def _line(obj: dict[str, object]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _user(entry_id: str, parent: str, text: str) -> dict[str, object]:
    return {"type": "message", "id": entry_id, "parentId": parent,
            "timestamp": "2026-11-30T03:00:00.000Z",
            "message": {"role": "user", "content": [{"type": "text", "text": text}],
                        "timestamp": 1796007600000}}


async def test_scan_sees_every_source_and_link(service: TranscriptService) -> None:
    cat = service.catalog
    by_source = cat.count_by_source()
    assert by_source == {"pi": 1, "openclaw-jsonl": 2, "openclaw-sqlite": 3}
    pi = cat.get(PI_ID)
    assert pi is not None and pi.agent_id == "pi"
    assert pi.compaction is not None and pi.compaction.entry_id == "ed590c70"
    assert pi.compaction.first_kept_id == "61503cc8"
    new7 = cat.get(OC7_LIVE)
    assert new7 is not None and new7.predecessor == OC7_OLD and new7.link == "reset_archive"
    assert new7.session_key == "agent:main:main"
    old7 = cat.get(OC7_OLD)
    assert old7 is not None and old7.info.ended
    nxt = cat.get(OC9_NEXT)
    assert nxt is not None and nxt.predecessor == OC9_MAIN and nxt.link == "session_windows"
    main = cat.get(OC9_MAIN)
    assert main is not None and [r.reason for r in main.resets] == ["reset"]
    assert main.compaction is not None and main.compaction.first_kept_id
    # The same key in two installations: no answer without naming the scope.
    assert cat.by_key("agent:main:main") is None
    scopes = cat.key_scopes("agent:main:main")
    assert len(scopes) == 2
    oc9_scope = next(s for s in scopes if "oc9" in s)
    current = cat.by_key("agent:main:main", oc9_scope)
    assert current is not None and current.session_id == OC9_NEXT
    assert [r.session_id for r in cat.key_history("agent:main:main", oc9_scope)] == [
        OC9_NEXT, OC9_MAIN]
    assert old7.predecessor is None  # never linked across installations
    assert {r.session_id for r in cat.sessions("main")} >= {OC9_MAIN, OC9_NEXT, OC7_LIVE}
    # Identification indexes cover the kept tail: a tool call of the last turns is found
    # by its sanitised wire form (transcript "call_b090...", request "callb090...")...
    assert cat.find_tool_call("callb0903b8440e4420a") == {OC9_MAIN}
    assert cat.find_tool_call("call_b0903b8440e4420a") == {OC9_MAIN}
    # ...while one from the first turn, long out of the tail, is not indexed.
    assert cat.find_tool_call("callee6852ba1db54570") == frozenset()
    assert len(cat.tail(OC9_MAIN, 30)) == 12  # the segment after the reset is shorter
    # A user text as the request carries it (OpenClaw prefix) finds the raw transcript text.
    assert cat.find_user_text("[Mon 2026-11-30 02:31 UTC] Gateway turn twenty-two: after idle"
                              " expiry (idleMinutes=1)") == {OC9_NEXT}
    assert cat.find_user_text("never said") == frozenset()
    summary = service.sessions_summary()
    assert all("messages" not in s for s in summary) and len(summary) == 6


async def test_tail_and_reset_segments(service: TranscriptService) -> None:
    cat = service.catalog
    main = cat.get(OC9_MAIN)
    assert main is not None
    after = cat.tail(OC9_MAIN, 4)
    assert [t.role for t in after] == ["user", "assistant", "user", "assistant"]
    assert after[-2].messages[0]["content"].startswith("[Mon 2026-11-30 02:30 UTC] resetnow")
    before = cat.tail(OC9_MAIN, 2, before=main.resets[-1].entry_id)
    # the segment the reset closed ends with the refused "/new" exchange
    assert [t.role for t in before] == ["user", "assistant"]
    assert before[0].messages[0]["content"].endswith("/new")  # after OpenClaw's time prefix
    ctx = cat.context(OC9_MAIN)
    assert ctx is not None and ctx[0]["content"][0]["text"].startswith(
        "The conversation history before this point was compacted")


async def test_append_with_partial_line(service: TranscriptService, roots: dict[str, Path]
                                        ) -> None:
    path = roots["pi"] / "--home-agent-pi-work--" / PI_FILE
    line = _line(_user("aaaa0001", "a92efea1", "a live line"))
    start = time.monotonic()
    with path.open("ab") as f:
        f.write(line[:20])
    await idle(service)
    assert service.catalog.tail(PI_ID, 1)[0].entry_id == "a92efea1"  # half a line waits
    with path.open("ab") as f:
        f.write(line[20:])
    start = time.monotonic()
    ok = await until(lambda: service.catalog.tail(PI_ID, 1)[0].entry_id
                                == "aaaa0001", 1.0)
    assert ok and time.monotonic() - start < 1.0
    assert PI_ID in service.catalog.find_user_text("a live line")
    assert service.catalog.context(PI_ID)[-1] == {  # type: ignore[index]
        "role": "user", "content": [{"type": "text", "text": "a live line"}]}


async def test_rename_to_reset_archive_then_new_session(service: TranscriptService,
                                                        roots: dict[str, Path]) -> None:
    folder = roots["oc7"] / "agents" / "main" / "sessions"
    live = folder / f"{OC7_LIVE}.jsonl"
    live.rename(folder / f"{OC7_LIVE}.jsonl.reset.2026-11-30T03-10-00.000Z")
    ok = await until(lambda: (r := service.catalog.get(OC7_LIVE)) is not None
                                and r.info.ended, 1.0)
    assert ok
    new_id = "11111111-2222-3333-4444-555555555555"
    header = {"type": "session", "version": 3, "id": new_id,
              "timestamp": "2026-11-30T03:10:00.001Z", "cwd": "/w"}
    (folder / f"{new_id}.jsonl").write_bytes(
        _line(header) + _line(_user("bbbb0001", None, "after reset")))  # type: ignore[arg-type]
    ok = await until(lambda: (r := service.catalog.get(new_id)) is not None
                                and r.predecessor == OC7_LIVE, 1.0)
    assert ok
    rec = service.catalog.get(new_id)
    assert rec is not None and rec.link == "reset_archive"


async def test_sqlite_rows_added_while_watching(service: TranscriptService,
                                                roots: dict[str, Path]) -> None:
    db = roots["oc9"] / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    conn = writable_db(db)
    last = conn.execute("SELECT max(seq) FROM transcript_events WHERE session_id=?",
                        (OC9_NEXT,)).fetchone()[0]
    leaf = service.catalog.tail(OC9_NEXT, 1)[0].entry_id
    parent = "5432861d-0000-0000-0000-000000000000"
    rows = conn.execute("SELECT event_json FROM transcript_events WHERE session_id=? AND seq=?",
                        (OC9_NEXT, last)).fetchone()
    parent = json.loads(rows[0])["id"]
    event = _user("cccc0001", parent, "sqlite live row")
    event["message"] = {"role": "user", "content": "sqlite live row", "timestamp": 1796007600000}
    blob = json.dumps(event).encode()
    nav = json.dumps({"version": 1, "report": {"kind": "canonical"}, "navigation": {},
                      "reset": {}, "model": {}, "modelBytes": 0,
                      "modelWithoutCheckpointBytes": 0, "withoutCustomDataBytes": 0})
    conn.execute("INSERT INTO transcript_events(session_id, seq, event_json, created_at, "
                 "event_zstd, event_utf8_bytes, navigation_json) VALUES (?,?,?,?,?,?,?)",
                 (OC9_NEXT, last + 1, None, 1796007600000,
                  zstandard.ZstdCompressor().compress(blob), len(blob), nav))
    ok = await until(
        lambda: service.catalog.tail(OC9_NEXT, 1)[0].entry_id == "cccc0001", 1.0)
    conn.close()
    assert ok, f"still at {leaf}"
    ctx = service.catalog.context(OC9_NEXT)
    assert ctx is not None and ctx[-1]["content"] == "[Mon 2026-11-30 03:00 UTC] sqlite live row"


async def test_files_untouched(roots: dict[str, Path]) -> None:
    before = snapshot(list(roots.values()))
    svc = TranscriptService(list(roots.values()), Metrics(), tail_limit=5)
    await svc.start()
    # by default small transcripts are read whole at start: exact counts
    pi = svc.catalog.get(PI_ID)
    assert pi is not None and pi.count_complete and pi.message_count == 34
    for record in svc.catalog.sessions():
        svc.catalog.context(record.session_id)
        svc.catalog.tail(record.session_id, 10)
    await svc.stop()
    assert snapshot(list(roots.values())) == before


async def test_old_compaction_found_beyond_the_startup_window(tmp_path: Path) -> None:
    from datetime import UTC

    folder = tmp_path / "pi" / "--w--"
    folder.mkdir(parents=True)
    lines = [_line({"type": "session", "version": 3, "id": "long", "cwd": "/w",
                    "timestamp": "2026-11-30T03:00:00.000Z"}),
             _line(_user("u0", None, "before")),  # type: ignore[arg-type]
             _line({"type": "compaction", "id": "c0", "parentId": "u0", "summary": "S",
                    "firstKeptEntryId": "u0", "tokensBefore": 1})]
    parent = "c0"
    for i in range(30):
        lines.append(_line(_user(f"m{i}", parent, f"turn {i}")))
        parent = f"m{i}"
    (folder / "2026-11-30T03-00-00-000Z_long.jsonl").write_bytes(b"".join(lines))
    svc = TranscriptService([tmp_path / "pi"], Metrics(), tz=UTC, small_whole=False)
    await svc.start()
    try:
        record = svc.catalog.get("long")
        assert record is not None and not record.count_complete
        assert record.compaction is None  # memory only: the older part is not read yet
        record = svc.catalog.full("long")  # reads it
        assert record is not None and record.compaction is not None
        assert record.compaction.entry_id == "c0"
        assert svc.catalog.get("long") == record
        ctx = svc.catalog.context("long")
        assert ctx is not None and len(ctx) == 1 + 1 + 30  # summary, kept u0, 30 turns
    finally:
        await svc.stop()


async def test_a_single_file_root(roots: dict[str, Path]) -> None:
    from datetime import UTC

    path = roots["pi"] / "--home-agent-pi-work--" / PI_FILE
    metrics = Metrics()
    svc = TranscriptService([path], metrics, tz=UTC)
    await svc.start()
    try:
        assert [r.session_id for r in svc.catalog.sessions()] == [PI_ID]
        (path.parent / "neighbour.jsonl").write_bytes(b"not ours\n")
        with path.open("ab") as f:
            f.write(_line(_user("dddd0001", "a92efea1", "file root append")))
        assert await until(
            lambda: svc.catalog.tail(PI_ID, 1)[0].entry_id == "dddd0001", 1.0)
        assert len(svc.catalog) == 1
        assert metrics.registry.get_sample_value(
            "tailfloor_transcript_errors_total", {"kind": "outside_root"}) is None
    finally:
        await svc.stop()


async def test_shrunk_or_replaced_file_is_read_again(service: TranscriptService,
                                                     roots: dict[str, Path]) -> None:
    path = roots["pi"] / "--home-agent-pi-work--" / PI_FILE
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    path.write_bytes(_line(header) + _line(_user("e1", None, "rewritten")))  # shrinks
    assert await until(
        lambda: [t.entry_id for t in service.catalog.tail(PI_ID, 5)] == ["e1"], 1.0)
    other = {**header, "id": "another-session"}
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(_line(other) + _line(_user("x1", None, "replaced")))
    tmp.replace(path)  # atomic replace: same name, another session
    assert await until(lambda: service.catalog.get("another-session") is not None
                                  and service.catalog.get(PI_ID) is None, 1.0)


async def test_metrics_and_successor_transcript(service: TranscriptService,
                                                roots: dict[str, Path]) -> None:
    reg = service.metrics.registry
    assert reg.get_sample_value("tailfloor_sessions", {"source": "openclaw-sqlite"}) == 3
    assert reg.get_sample_value("tailfloor_sessions", {"source": "pi"}) == 1
    lines = reg.get_sample_value("tailfloor_transcript_lines_total", {"source": "pi"}) or 0
    assert lines > 0
    # OpenClaw (truncateAfterCompaction): a successor file names the old one in its header.
    folder = roots["oc7"] / "agents" / "main" / "sessions"
    header = {"type": "session", "version": 3, "id": "succ-1", "cwd": "/w",
              "timestamp": "2026-11-30T03:20:00.000Z",
              "parentSession": str(folder / f"{OC7_LIVE}.jsonl")}
    (folder / "2026-11-30T03-20-00-000Z_succ-1.jsonl").write_bytes(
        _line(header) + _line(_user("s1", None, "continued")))  # type: ignore[arg-type]
    assert await until(lambda: (r := service.catalog.get("succ-1")) is not None
                                  and r.predecessor == OC7_LIVE, 1.0)
    rec = service.catalog.get("succ-1")
    assert rec is not None and rec.link == "parent_session" and rec.agent_id == "main"
    # The catalog changes in the reader thread; the loop records the batch's lag right after.
    assert await until(lambda: (reg.get_sample_value("tailfloor_transcript_lag_seconds_count")
                                or 0) >= 1, 1.0)
    assert reg.get_sample_value("tailfloor_sessions", {"source": "openclaw-jsonl"}) == 3


async def test_a_session_inside_a_directory_that_appears_is_seen(tmp_path: Path) -> None:
    """Pi's first session in a new working directory: mkdir, then the file at once. The
    watcher follows a new directory only once it has seen it, so the file's own event may
    never come (about one time in six here). A directory moved into the root with its file
    already inside never reports the file at all: that case makes the race certain."""
    root = tmp_path / "sessions"
    root.mkdir()
    svc = TranscriptService([root], Metrics(), tz=None)
    await svc.start()
    try:
        for n in range(3):
            folder = tmp_path / f"--home-a-project{n}--"
            folder.mkdir()
            sid = f"01a22a42-1ed4-778c-a542-c559c46de9{n:02d}"
            header = {"type": "session", "version": 3, "id": sid,
                      "timestamp": "2026-11-30T03:00:00.000Z", "cwd": f"/home/a/project{n}"}
            (folder / f"2026-11-30T03-00-00-000Z_{sid}.jsonl").write_bytes(
                _line(header) + _line(_user("u1", "", f"first words {n}")))
            folder.rename(root / folder.name)
            assert await until(lambda sid=sid: svc.catalog.get(sid) is not None, 2.0), n
    finally:
        await svc.stop()

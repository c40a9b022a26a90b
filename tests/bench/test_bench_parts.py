"""The benchmark's own parts: the OS accounting it reads, and the session-scale load's
transcripts and requests (that the floor identifies and restores them, before a run
relies on it). No timing is asserted."""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from proxy.metrics import Metrics
from proxy.policy.records import builtin_rules
from proxy.tokens import TokenCounter
from proxy.transcripts.service import TranscriptService
from tests.bench import cold_floor, procs, thousand_agents
from tests.bench.loadgen import measure_stream
from tests.bench.sessions_scale import (
    KEPT,
    RESTORED,
    Session,
    generate,
    script_replies,
    session_copy,
)
from tests.fake_upstream import FakeUpstream, Reply
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, chat
from tests.inprocess import InProcessProxy
from tests.transcripts.waiting import until


def test_parse_cpu_ticks_reads_own_and_reaped_children_time() -> None:
    # pid (comm) state ppid ... utime stime cutime cstime: fields 14-17 of stat(5)
    fields = ["S", "1", *["0"] * 9, "5", "7", "11", "13", "20"]
    assert procs.parse_cpu_ticks(fields) == 5 + 7 + 11 + 13


def test_tree_holds_a_child_and_counts_its_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\n"
                              "time.sleep(30)"])
    try:
        assert until_sync(lambda: child.pid in procs.tree(os.getpid()))
        assert until_sync(lambda: procs.tree_cpu_seconds(os.getpid()) >=
                          procs.cpu_seconds(os.getpid()) + 0.2, seconds=10)
        assert procs.tree_rss_mb(os.getpid()) > procs.rss_mb(os.getpid())
    finally:
        child.kill()
        child.wait()


def until_sync(check: object, seconds: float = 5.0) -> bool:
    import time

    assert callable(check)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def seen_last(service: TranscriptService, s: Session) -> bool:
    """Whether the service has read the last entry written to the session's transcript."""
    tail = service.catalog.tail(s.transcript.session_id, 1)
    return bool(tail) and tail[0].entry_id == s.transcript.objs[-1]["id"]


async def test_generated_sessions_are_identified_and_restored(tmp_path: Path) -> None:
    sessions = generate(tmp_path, active=3, tracked=20)
    service = TranscriptService([tmp_path], Metrics(), tail_limit=200)
    await service.start()
    try:
        assert await until(lambda: len(service.catalog) == 20, 10)
        floor = FloorHarness(Holder(builtin_rules()), TokenCounter(), service.catalog)
        ids = set()
        assert len(sessions) == 4  # three and one to warm up with
        for generated in sessions[:3]:
            s = session_copy(generated)
            for _turn in range(3):
                decision = floor.decide(chat(s.body), {})
                assert decision.verdict.startswith(RESTORED), decision.verdict
                assert decision.session_id == s.transcript.session_id
                ids.add(decision.session_id)
                s.next_turn(write=True)
                assert await until(functools.partial(seen_last, service, s), 10)
            lines = s.path.read_bytes().splitlines()
            assert orjson.loads(lines[-1])["id"] == s.transcript.objs[-1]["id"]
        assert len(ids) == 3
    finally:
        await service.stop()


async def test_an_agent_that_compacts_again_sends_what_its_transcript_holds(
        tmp_path: Path) -> None:
    """``--compact-every``: after the agent compacts again, its request is what the written
    transcript's context renders (the summary, the kept messages, the question), and the
    floor identifies it and restores what the compaction cut."""
    sessions = generate(tmp_path, active=1, tracked=5)
    service = TranscriptService([tmp_path], Metrics(), tail_limit=200)
    await service.start()
    try:
        assert await until(lambda: len(service.catalog) == 5, 10)
        s = session_copy(sessions[0])
        sid = s.transcript.session_id
        for _turn in range(4):
            s.next_turn(write=True)
        s.next_turn_compacted(write=True)
        assert await until(functools.partial(seen_last, service, s), 10)
        assert s.compactions == 1 and s.since_compaction == 0
        assert len(s.body["messages"]) == 1 + 1 + KEPT + 1  # system, summary, kept, question
        assert s.body["messages"][1:] == service.catalog.context(sid)
        floor = FloorHarness(Holder(builtin_rules()), TokenCounter(), service.catalog)
        decision = floor.decide(chat(s.body), {})
        assert decision.verdict.startswith(RESTORED), decision.verdict
        assert decision.session_id == sid
    finally:
        await service.stop()


async def test_a_thousand_agents_root_is_tracked_whole(tmp_path: Path) -> None:
    """Pi files and OpenClaw databases of the thousand-agents load: every session written
    is one the service tracks, the OpenClaw ones with their messages."""
    sessions, census = thousand_agents.generate(tmp_path, tracked=60, active=2,
                                                openclaw_share=0.5, per_db=12)
    assert census["pi_sessions"] + census["openclaw_sessions"] == 60
    dbs = sorted((tmp_path / "openclaw").rglob("openclaw-agent.sqlite"))
    assert len(dbs) == 3  # 30 sessions, 12 to a database
    written = set()
    for db in dbs:
        with sqlite3.connect(db) as conn:
            written |= {sid for (sid,) in conn.execute(
                "SELECT DISTINCT session_id FROM transcript_events")}
    assert len(written) == 30
    service = TranscriptService([tmp_path / "pi", tmp_path / "openclaw"], Metrics(),
                                tail_limit=200)
    await service.start()
    try:
        assert await until(lambda: len(service.catalog) == 60, 20)
        for sid in written:
            assert service.catalog.tail(sid, 3), sid
        assert len(sessions) == 3
    finally:
        await service.stop()


def test_rss_slope_is_the_least_squares_line() -> None:
    line = [(float(t), 100.0 + 0.5 * t) for t in range(0, 600, 5)]  # 0.5 MB/s
    assert abs(thousand_agents.slope_mb_per_min(line) - 30.0) < 1e-9
    assert thousand_agents.slope_mb_per_min([(0.0, 5.0), (10.0, 5.0)]) == 0.0


def test_session_memory_measures_each_part(tmp_path: Path) -> None:
    from tests.bench import session_memory
    from tests.bench.cold_start import generate as write_sessions

    write_sessions(tmp_path, 1, 30)
    report = session_memory.measure(tmp_path, served=5, prints=300, top=3)
    assert report["sessions"] == 30
    assert len(report["tracked_top"]) == 3
    assert report["tracked_bytes_per_session"] > 0
    assert report["renderings"] >= 5  # the tails read kept their renderings
    # a rendering is counted in the memory it holds: the budget is what they hold at most
    assert 0.85 <= report["rendered_bytes_per_budget_byte"] <= 1.1
    # (each figure rounded: the ratio to 0.01, the megabytes to 0.1)
    assert report["rendered_at_most_mb"] == pytest.approx(
        report["rendered_bytes_per_budget_byte"] * report["rendered_budget_bytes"] / 1e6,
        abs=0.05 + 0.005 * report["rendered_budget_bytes"] / 1e6)
    assert report["fingerprint_bytes_per_session"] > 0


def test_cold_floor_decides_every_session_cold_then_warm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cold_floor.decisions(tmp_path, 4, busy_loop=True)
    out = capsys.readouterr().out
    assert "cold, 4 sessions (4 restored) beside a busy loop" in out
    assert "warm: CPU" in out


def test_scripted_replies_cut_the_share_asked_for(clean_fake: FakeUpstream) -> None:
    script_replies(clean_fake.port, 20, 6, 0.01, broken=0.25)
    cut = [reply.close_after_chunks for reply in clean_fake.script]
    assert len(cut) == 20 and cut.count(3) == 5 and cut.count(None) == 15
    assert all(reply.pieces == 6 and reply.stamp for reply in clean_fake.script)
    script_replies(clean_fake.port, 4, 6, 0.01)
    assert [reply.close_after_chunks for reply in clean_fake.script] == [None] * 4


def test_a_stream_cut_off_is_seen_by_its_error_event(clean_fake: FakeUpstream) -> None:
    proxy = InProcessProxy(clean_fake)
    try:
        clean_fake.script.extend([Reply(pieces=6), Reply(pieces=6, close_after_chunks=3)])
        whole = asyncio.run(measure_stream(proxy.port))
        cut = asyncio.run(measure_stream(proxy.port))
    finally:
        proxy.stop()
    assert (whole.status, whole.error_events) == (200, 0)
    assert (cut.status, cut.error_events) == (200, 1) and 0 < cut.events < whole.events


def test_idle_pairs_measure_each_setting_in_turn(tmp_path: Path,
                                                  clean_fake: FakeUpstream) -> None:
    from tests.bench import cold_start

    cold_start.generate(tmp_path / "root", 2, 3)
    figures = cold_start.idle_pairs(tmp_path / "root", clean_fake.port, 1, 0.3)
    assert set(figures) == {"without_health_process", "with_health_process"}
    assert all(len(each) == 1 and each[0] >= 0 for each in figures.values())

"""What each file under a root is, and where the roots are by default."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.transcripts.discovery import classify, default_roots, inside, reset_time

OC = Path("/h/.openclaw/agents/ops/sessions")


def test_classify_openclaw_and_pi_files() -> None:
    assert classify(OC / "abc.jsonl").role == "openclaw-jsonl"
    assert classify(OC / "abc.jsonl").agent_id == "ops"
    archive = classify(OC / "abc.jsonl.reset.2026-11-30T02-39-17.494Z")
    assert archive.role == "reset-archive"
    assert archive.archive_time == reset_time("2026-11-30T02-39-17.494Z")
    assert classify(OC / "abc.jsonl.deleted.2026-11-30T02-39-17Z").role == "deleted-archive"
    for name in ("abc.trajectory.jsonl", "abc.checkpoint.0d1e.jsonl", "abc.jsonl.lock",
                 "abc.jsonl.bak.2026-11-30T02-39-17Z", "abc.trajectory-path.json"):
        assert classify(OC / name).role == "ignored", name
    assert classify(OC / "sessions.json").role == "sessions-json"
    db = Path("/h/.openclaw/agents/main/agent/openclaw-agent.sqlite")
    assert classify(db).role == "sqlite" and classify(db).agent_id == "main"
    assert classify(db.with_name("openclaw-agent.sqlite-wal")).role == "sqlite-side"
    imported = Path("/h/.openclaw/agents/main/session-sqlite-import-archive/x/a.jsonl")
    assert classify(imported).role == "ignored"
    assert classify(Path("/h/.pi/agent/sessions/--w--/2026_x.jsonl")).role == "pi"


def test_default_roots_follow_the_environment() -> None:
    home = Path("/home/u")
    assert default_roots({}, home) == [home / ".openclaw", home / ".pi/agent/sessions"]
    assert default_roots({"OPENCLAW_STATE_DIR": "/s", "PI_CODING_AGENT_DIR": "/p"}, home) == [
        Path("/s"), Path("/p/sessions")]
    assert reset_time("not a time") is None


_PATHS = st.lists(st.sampled_from(["a", "b", "ab", "..", ".", "", "/"]), max_size=5).map(
    lambda parts: Path(*parts) if parts else Path())


@settings(max_examples=500, deadline=None)
@given(_PATHS, st.lists(_PATHS, max_size=3))
def test_inside_agrees_with_pathlib(path: Path, roots: list[Path]) -> None:
    """The oracle: pathlib's own ``is_relative_to`` (or the root itself)."""
    expected = any(path == r or path.is_relative_to(r) for r in roots)
    assert inside(path, roots) is expected

"""``tailfloor doctor`` as a newcomer runs it: the real command against a real fake upstream,
a transcript root and a rules directory; what it says is wrong, and that it says how to fix
it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, ProxyProcess, free_port
from tests.fake_upstream import FakeUpstream


def doctor(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "proxy", "doctor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout


def test_a_good_set_up_is_all_ok(fake: FakeUpstream, tmp_path: Path) -> None:
    root = tmp_path / "sessions" / "--home-a--"
    root.mkdir(parents=True)
    (root / "2026-12-02T10-00-00-000Z_s1.jsonl").write_text('{"type":"session"}\n')
    code, out = doctor("--upstream", fake.url, "--sessions", str(tmp_path / "sessions"),
                       "--admin-listen", f"127.0.0.1:{free_port()}")
    assert code == 0, out
    assert "1 JSONL transcripts" in out and f"upstream {fake.url}: answers" in out
    assert "0 problems" in out


def test_what_is_wrong_is_said_with_its_fix(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "bad.toml").write_text("[defaults]\nmin_tail_messages = -3\n")
    code, out = doctor("--upstream", f"http://127.0.0.1:{free_port()}", "--sessions",
                       str(tmp_path / "nowhere"), "--rules", str(rules))
    assert code == 1
    lines = out.splitlines()
    assert "min_tail_messages = -3" in out  # which field of which file
    for what in ("does not exist", "no transcript found", "rules in", "cannot connect"):
        at = next(i for i, line in enumerate(lines) if what in line)
        assert lines[at].startswith("problem"), (what, out)
        fix = next(line for line in lines[at + 1:] if not line.startswith("  - "))
        assert fix.strip().startswith("fix:"), (what, out)


def test_a_running_tailfloor_is_found_on_the_admin_port(fake: FakeUpstream,
                                                        tmp_path: Path) -> None:
    proxy = ProxyProcess(fake.url)
    try:
        _code, out = doctor("--upstream", fake.url, "--admin-listen",
                            f"127.0.0.1:{proxy.admin_port}", "--sessions", str(tmp_path))
        assert "a tailfloor answers" in out, out
    finally:
        proxy.stop()


def test_serve_says_where_it_looked_when_it_finds_no_transcript(fake: FakeUpstream,
                                                                 tmp_path: Path) -> None:
    proxy = ProxyProcess(fake.url, "--sessions", str(tmp_path), "--log-format", "text")
    try:
        deadline = time.monotonic() + 10
        while "no transcript found" not in proxy.logs() and time.monotonic() < deadline:
            time.sleep(0.05)
        line = next(x for x in proxy.logs().splitlines() if "no transcript found" in x)
        assert str(tmp_path) in line and "--sessions" in line and "tailfloor doctor" in line
    finally:
        proxy.stop()

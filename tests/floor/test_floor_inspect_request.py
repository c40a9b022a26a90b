"""``tailfloor inspect SESSION --request FILE``: the rewrite a given request would get."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.floor.replay import CAPTURES, keep_before, recorded, recorded_at

ROOT = Path(__file__).resolve().parents[2]
SESSION = "01a22a42-1ed4-778c-a542-c559c46de9e7"


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "inspect", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_inspect_shows_the_restore_a_recorded_request_would_get(tmp_path: Path) -> None:
    shutil.copytree(CAPTURES / "pi-02-rpc-main" / "sessions", tmp_path / "sessions")
    (transcript,) = (tmp_path / "sessions").rglob("*.jsonl")
    keep_before(transcript, recorded_at("pi-02-rpc-main", 11))
    before = transcript.read_bytes()
    request = tmp_path / "request.json"
    request.write_text(json.dumps(recorded("pi-02-rpc-main", 11)))
    args = [SESSION[:8], "--sessions", str(tmp_path / "sessions"), "--request", str(request)]
    shown = json.loads(inspect(*args, "--json").stdout)
    assert shown["kind"] == "floor" and shown["added_messages"] >= 8
    roles = [m["role"] for m in shown["messages"]]
    assert roles[0] == "system" and roles[1] == "user"
    assert "compacted into the following summary" in json.dumps(shown["messages"][1])
    text = inspect(*args).stdout
    assert text.startswith(f"session {SESSION}: floor; restored=")
    assert transcript.read_bytes() == before  # read-only
    request.write_text("[1, 2]")
    assert inspect(*args).returncode == 2

"""The server follows transcripts: GET /tailfloor/sessions and the sessions gauge."""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import orjson

from tests.fake_upstream import FakeUpstream
from tests.inprocess import InProcessProxy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transcripts" / "captures"


def test_sessions_route_lists_metadata_only(fake: FakeUpstream, tmp_path: Path) -> None:
    root = tmp_path / "pi"
    shutil.copytree(FIXTURES / "pi-02-rpc-main" / "sessions", root)
    process = InProcessProxy(fake, "--sessions", str(root))
    try:
        with urllib.request.urlopen(process.admin_url + "/tailfloor/sessions",
                                    timeout=5) as response:
            listing = orjson.loads(response.read())["sessions"]
        assert [s["session_id"] for s in listing] == ["01a22a42-1ed4-778c-a542-c559c46de9e7"]
        assert listing[0]["source"] == "pi" and listing[0]["message_count"] > 10
        assert "content" not in orjson.dumps(listing).decode()
        assert process.sample("tailfloor_sessions", source="pi") == 1
        # A new session file appears: the view follows within a second.
        new = root / "2026-11-30T05-00-00-000Z_01a22a99-0000-7000-8000-000000000001.jsonl"
        new.write_text(
            '{"type":"session","version":3,"id":"01a22a99-0000-7000-8000-000000000001",'
            '"timestamp":"2026-11-30T05:00:00.000Z","cwd":"/w"}\n')
        deadline = time.monotonic() + 3
        while process.sample("tailfloor_sessions", source="pi") < 2:
            assert time.monotonic() < deadline, "new session not picked up"
            time.sleep(0.05)
    finally:
        process.stop()

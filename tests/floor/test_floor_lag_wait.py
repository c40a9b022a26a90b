"""A request that runs ahead of its transcript waits (briefly) for the watcher.

Through a real ``tailfloor serve`` and real file timing: while an agent is writing, a
compacted conversation arrives whose transcript was written a few milliseconds before, so
the watcher (50 ms debounce) has not read it yet. The request must not go out unidentified:
tailfloor waits for the next batch of changes (at most 200 ms), then restores. Three runs in
a row; the oracle is what the upstream received, recounted.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import orjson

from proxy.transcripts.catalog import Catalog
from tests.conftest import ProxyProcess
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import Transcript, conversation, put, request_for
from tests.floor.test_floor_tenants import RULES, write_session
from tests.inprocess import InProcessProxy


def _compacted(session_id: str) -> Transcript:
    t = Transcript(session_id)
    conversation(t, 20, tools_every=0, text=f"words of {session_id[-4:]}")
    kept = t.message_ids()[-2]
    t.compaction(f"The unique summary of session {session_id}.", kept)
    return t


def _histogram_count(proxy: ProxyProcess, outcome: str) -> float:
    for line in proxy.metrics_text().splitlines():
        if line.startswith("tailfloor_identification_wait_seconds_count") and \
                f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _until_tracked(proxy: ProxyProcess, session_id: str, bound: float = 10.0) -> None:
    """The watcher has read the session (the admin listener lists it)."""
    deadline = time.monotonic() + bound
    while True:
        with urllib.request.urlopen(proxy.admin_url + "/tailfloor/sessions", timeout=5) as r:
            listed = orjson.loads(r.read())["sessions"]
        if any(s.get("session_id") == session_id for s in listed):
            return
        assert time.monotonic() < deadline, f"the watcher never read {session_id}"
        time.sleep(0.02)


def rules_and_root(tmp_path: Path) -> tuple[Path, Path]:
    """A rules directory with N = 8, and an empty sessions root."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "floor.toml").write_text(RULES.replace("min_tail_messages = 30",
                                                    "min_tail_messages = 8"))
    root = tmp_path / "sessions"
    root.mkdir()
    return rules, root


def test_a_request_ahead_of_its_transcript_waits_for_the_watcher(
        fake: FakeUpstream, tmp_path: Path) -> None:
    rules, root = rules_and_root(tmp_path)
    proxy = InProcessProxy(fake, "--sessions", str(root), "--rules", str(rules))
    try:
        for run in range(3):
            fake.reset()
            # Some agent is at work: a transcript changed a moment ago.
            busy = Transcript(f"01a22a55-0000-7000-8000-00000000b{run:03d}")
            conversation(busy, 2, tools_every=0, text=f"busy {run}")
            write_session(root, busy, stamp=f"2026-11-30T01-00-0{run}-000Z")
            _until_tracked(proxy, busy.session_id)
            session = _compacted(f"01a22a55-0000-7000-8000-00000000c{run:03d}")
            catalog = Catalog()
            put(catalog, session)
            body = request_for(catalog, session.session_id, extra=[
                {"role": "user", "content": [{"type": "text", "text": f"next {run}"}]}])
            write_session(root, session, stamp=f"2026-11-30T02-00-0{run}-000Z")
            request = urllib.request.Request(
                proxy.url + "/v1/chat/completions", data=orjson.dumps({**body, "stream": False}),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
                verdict = response.headers["x-tailfloor"]
            sent = orjson.loads(fake.chat_requests()[-1].body)["messages"]
            raw = sum(1 for m in sent[2:] if m["role"] in ("user", "assistant", "tool"))
            assert verdict.startswith("floor; restored="), f"run {run}: {verdict}"
            assert raw >= 8, f"run {run}: {raw} raw messages went upstream"
        waited = _histogram_count(proxy, "identified")
        assert waited >= 1, proxy.metrics_text()
    finally:
        proxy.stop()

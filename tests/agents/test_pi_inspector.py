"""The inspector's pages for the real Pi agent, checked against what the fake upstream
received (never against the inspector's own data): after Pi compacts, the newest request
shows Pi's summary and exactly as many ``restored`` messages as tailfloor's verdict said, in
the transcript's order; after ``new_session`` the new session's page shows the ``carried``
messages with the old session's id; an overflow tailfloor recovers shows two attempts and a
``summary`` by tailfloor. A screenshot of each session page is kept with the artifacts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from selenium.webdriver.common.by import By

from tests.agents.live_proxy import watched_proxy
from tests.agents.pi_agent import PI_LATEST, PI_VERSION, PiAgent
from tests.agents.pi_rpc import PiRpc
from tests.agents.sizing import PiPrompts
from tests.agents.test_pi_live_floor import (
    AFTER,
    NEW_SESSION,
    RULES,
    TEXT_TURNS,
    compacting_pi,
    pi_request_raw,
    transcript_raw,
)
from tests.agents.test_pi_overflow import ROOM_CHARS
from tests.conftest import ProxyProcess
from tests.evidence import Evidence, artifacts_root
from tests.fake_behaviour import SUMMARY_MARKER, AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream
from tests.inspector.browser import chrome
from tests.inspector.client import fetch, message_hash, session_json, session_url
from tests.recovery.conversation import rules_dir


def hashes(messages: list[dict[str, Any]]) -> list[str]:
    return [message_hash(m) for m in messages]


def session_id_of(transcript: Path) -> str:
    header = json.loads(transcript.read_text().splitlines()[0])
    found: str = header["id"]
    return found


def request_ending(proxy: ProxyProcess, session: str, text: str) -> dict[str, Any]:
    """The session's newest kept request whose last message says ``text``."""
    for request in session_json(proxy, session)["session"]["requests"]:
        if text in (request["messages"][-1].get("text") or ""):
            return request
    raise AssertionError(f"no kept request of {session} ends with {text!r}")


def count_in(verdict: str, word: str) -> int:
    found = re.search(rf"\b{word}=(\d+)", verdict)
    assert found is not None, verdict
    return int(found.group(1))


def screenshot(proxy: ProxyProcess, session: str, name: str, provenance: str) -> int:
    """The session page in Chromium: how many messages of its newest request carry
    ``provenance``; the page saved as ``name``."""
    where = artifacts_root() / "inspector"
    where.mkdir(parents=True, exist_ok=True)
    with chrome() as driver:
        driver.set_window_size(1280, 1400)
        driver.get(session_url(proxy, session))
        newest = driver.find_element(By.CSS_SELECTOR, "details.request[open]")
        found = len(newest.find_elements(
            By.CSS_SELECTOR, f"li.message[data-provenance={provenance}]"))
        driver.save_screenshot(str(where / name))
    return found


@pytest.mark.parametrize("version", [PI_VERSION, PI_LATEST])
def test_pi_s_compaction_and_new_session_on_the_session_pages(
        fake: FakeUpstream, tmp_path: Path, version: str, pi_prompt: PiPrompts,
        evidence: Evidence) -> None:
    proxy, root = watched_proxy(fake, tmp_path, RULES.format(n=8), evidence, "--inspect-content")
    fake.reset()
    fake.behaviour = AgentBehaviour()
    # the new session names itself: its requests are filed under its own id (without,
    # tailfloor ties them to no session until it has read its file)
    pi = compacting_pi(tmp_path / "pi", root / "run", proxy.url + "/v1", version, pi_prompt,
                       affinity=True)
    rpc = PiRpc(pi)
    try:
        assert any(rpc.prompt(message) for message in TEXT_TURNS), "Pi never compacted"
        rpc.prompt(AFTER)
        rpc.new_session()
        rpc.prompt(NEW_SESSION[0])
    finally:
        rpc.close()
    try:
        old, new = (session_id_of(p) for p in pi.session_files())
        bodies = [orjson.loads(r.body)["messages"] for r in fake.chat_requests()]
        after = next(b for b in bodies
                     if AFTER in json.dumps(b[-1]) and not is_summarization(b))
        fresh = next(b for b in bodies if NEW_SESSION[0] in json.dumps(b[-1]))

        # after the compaction: Pi's summary, then the restored messages, as received
        shown = request_ending(proxy, old, AFTER)
        assert shown["verdict"].startswith("floor; restored="), shown["verdict"]
        restored = count_in(shown["verdict"], "restored")
        assert [m["hash"] for m in shown["messages"]] == hashes(after)
        marks = [m["provenance"] for m in shown["messages"]]
        assert marks[1] == "summary" and shown["messages"][1]["author"] == "agent"
        assert "<summary>" in json.dumps(after[1])
        assert marks.count("restored") == restored > 0
        assert marks[2:2 + restored] == ["restored"] * restored
        theirs = transcript_raw(pi.session_files()[0])
        back = pi_request_raw(after[2:2 + restored])
        start = theirs.index(back[0])
        assert theirs[start:start + restored] == back  # the transcript's order
        assert screenshot(proxy, old, f"pi{version}-floor.png", "restored") == restored

        # after new_session: the old session's messages, carried, naming it
        shown = request_ending(proxy, new, NEW_SESSION[0])
        assert shown["verdict"].startswith("carry; carried="), shown["verdict"]
        carried = count_in(shown["verdict"], "carried")
        assert [m["hash"] for m in shown["messages"]] == hashes(fresh)
        moved = [m for m in shown["messages"] if m["provenance"] == "carried"]
        assert len(moved) == carried > 0
        assert {m["session"] for m in moved} == {old}
        ours = pi_request_raw([fresh[m["index"]] for m in moved])
        assert ours == theirs[len(theirs) - len(ours):]  # the old session's end
        assert screenshot(proxy, new, f"pi{version}-carry.png", "carried") == carried
    finally:
        fake.behaviour = None
        proxy.stop()


def test_an_overflow_recovered_for_pi_on_its_session_page(
        clean_fake: FakeUpstream, tmp_path: Path, pi_prompt: PiPrompts) -> None:
    max_chars = pi_prompt(PI_VERSION).chars + ROOM_CHARS
    clean_fake.behaviour = AgentBehaviour(max_chars=max_chars)
    proxy = ProxyProcess(clean_fake.url, "--rules", str(rules_dir(tmp_path)),
                         "--state", str(tmp_path / "state"), "--inspect-content")
    try:
        pi = PiAgent(tmp_path / "pi", proxy.url + "/v1", context_window=100000)
        pi.turn("Turn one: LONG_REPLY please")
        pi.turn("Turn two: LONG_REPLY again")
        pi.turn("Turn three: hello")
        retry = orjson.loads(clean_fake.chat_requests()[-1].body)["messages"]
        assert SUMMARY_MARKER in json.dumps(retry)
        listing = orjson.loads(fetch(proxy.admin_url + "/tailfloor/ui?format=json")[2])
        (row,) = listing["sessions"]
        assert row["compactions"] == 1 and row["overflows"] == 1
        shown = request_ending(proxy, row["id"], "Turn three: hello")
        assert [a["status"] for a in shown["attempts"]] == [400, 200]
        assert [m["hash"] for m in shown["messages"]] == hashes(retry)
        summaries = [m for m in shown["messages"] if m["provenance"] == "summary"]
        assert [m["author"] for m in summaries] == ["tailfloor"]
        assert SUMMARY_MARKER in json.dumps(retry[summaries[0]["index"]])
        assert summaries[0]["replaced"] > 0
        assert screenshot(proxy, row["id"], "pi-overflow.png", "summary") == 1
    finally:
        clean_fake.behaviour = None
        proxy.stop()

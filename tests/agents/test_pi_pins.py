"""Pinned messages on the real Pi agent (0.73.1 and 1.6.0), live, in its default
configuration: turn 2 pins "Leave the database alone...", long turns follow until Pi
compacts; the first request after the compaction holds the pin verbatim right after Pi's
summary; after ``new_session`` the new session's requests still hold it; after ``!unpin``
(and one more turn, the watcher's lag) it is gone. ``LIVE_RUNS`` runs per release.

The oracle is the upstream's recording of what it received, and Pi's own transcript (the
pin is there as the user wrote it, and Pi's summary replaced it in Pi's own context).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.live_proxy import LIVE_RUNS, watched_proxy
from tests.agents.pi_agent import PI_LATEST, PI_VERSION, PiAgent, release
from tests.agents.pi_rpc import PiRpc
from tests.agents.sizing import PiPrompts
from tests.agents.test_pi_live_floor import RESERVE, ROOM_TOKENS, RULES, TEXT_TURNS
from tests.evidence import Evidence
from tests.fake_behaviour import AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream

PIN = "!pin Leave the database alone. Today, we are only editing documentation."
NOTE = "[tailfloor] Pinned by the user earlier in this conversation:"
PINNED = NOTE + "\n\n" + PIN


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def pinned_at(messages: list[dict[str, Any]]) -> int | None:
    found = [i for i, m in enumerate(messages) if text_of(m) == PINNED]
    assert len(found) <= 1, "the pin went in twice"
    return found[0] if found else None


@pytest.mark.parametrize("version", [PI_VERSION, PI_LATEST])
def test_a_pin_survives_pi_s_compaction_and_its_new_session_until_unpinned(
        fake: FakeUpstream, tmp_path: Path, version: str, pi_prompt: PiPrompts,
        evidence: Evidence) -> None:
    window = pi_prompt(version).tokens + ROOM_TOKENS
    proxy, root = watched_proxy(fake, tmp_path, RULES.format(n=8), evidence)
    seen: list[dict[str, Any]] = []
    try:
        for run in range(LIVE_RUNS):
            fake.reset()
            fake.behaviour = AgentBehaviour()
            pi = PiAgent(tmp_path / f"pi{run}", proxy.url + "/v1", context_window=window,
                         reserve_tokens=RESERVE, keep_recent_tokens=800, pi=release(version))
            pi.sessions = root / f"run{run}"
            pi.sessions.mkdir()
            rpc = PiRpc(pi)
            try:
                rpc.prompt(f"Hello, a first turn. [run {run}]")
                rpc.prompt(PIN)
                assert any(rpc.prompt(f"{t} [run {run}]") for t in TEXT_TURNS), \
                    "Pi never compacted"
                rpc.prompt(f"The first question after the compaction. [run {run}]")
                rpc.new_session()
                rpc.prompt(f"A new session starts here. [run {run}]")
                rpc.prompt(f"And goes on for a turn. [run {run}]")
                rpc.prompt("!unpin database")
                rpc.prompt(f"A turn after the unpin. [run {run}]")
                rpc.prompt(f"And one more. [run {run}]")
            finally:
                rpc.close()
            bodies = [orjson.loads(r.body) for r in fake.chat_requests()]
            main = [b for b in bodies if not is_summarization(b["messages"])]
            summarized = next(i for i, b in enumerate(bodies) if is_summarization(b["messages"]))
            old, new = pi.session_files()
            assert any(json.dumps(PIN)[1:-1] in line for line in old.read_text().splitlines())
            after = [b for b in bodies[summarized + 1:] if not is_summarization(b["messages"])]
            first = after[0]["messages"]
            where = f"pi {version} run {run}"
            assert "<summary>" in text_of(first[1]), where
            assert pinned_at(first) == 2, f"{where}: {[text_of(m)[:40] for m in first]}"
            # its own session's requests before the compaction held it raw: nothing added
            before = [b for b in main if b is not after[0] and bodies.index(b) < summarized]
            assert all(pinned_at(b["messages"]) is None for b in before), where
            fresh = next(i for i, b in enumerate(bodies)
                     if "A new session starts here." in json.dumps(b["messages"][-1]))
            assert pinned_at(bodies[fresh]["messages"]) is not None, f"{where}: not carried"
            unpinned = next(i for i, b in enumerate(bodies)
                        if "And one more." in json.dumps(b["messages"][-1]))
            assert pinned_at(bodies[unpinned]["messages"]) is None, f"{where}: still pinned"
            assert new.exists()
            seen.append({"after": pinned_at(first), "carried": True})
    finally:
        fake.behaviour = None
        proxy.stop()
    print(f"pi {version} pins per run: {seen}")

"""The real Pi agent behind tailfloor: the floor after Pi's own compaction, the tail carried
into a new Pi session, and Pi compacting no more often than without tailfloor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.floor.restore import is_counted
from proxy.identity.identify import identify
from tests.agents.pi_agent import PI_VERSION, PiAgent
from tests.agents.sizing import PiPrompts
from tests.agents.snippets import provider_shown, url_at
from tests.conftest import ProxyProcess
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream

N = 12
RULES = f"""[defaults]
min_tail_messages = {N}

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
# The fake counts JSON characters / 4; text characters / 4 plus this margin covers it, so
# the usage Pi sees is never more than what Pi itself sent.
margin = 0.3
"""
TURNS = ["Turn one: hello", "Turn two: USE_TOOL:bash", "Turn three: LONG_REPLY please",
         "Turn four: LONG_REPLY again", "Turn five: LONG_REPLY once more",
         "Turn six: LONG_REPLY and more", "Turn seven: short"]
# Pi's window: its fixed prompt (measured) plus this; Pi compacts 1500 (its reserve) below.
ROOM_TOKENS = 4650


def compactions(pi: PiAgent) -> int:
    return sum(1 for path in pi.session_files() for e in pi.entries(path)
               if e["type"] == "compaction")


def raw_entries(entries: list[dict[str, Any]], since: str | None = None) -> int:
    """Raw messages of a Pi transcript (from entry ``since`` on)."""
    ids = [e.get("id") for e in entries]
    start = ids.index(since) if since in ids else 0
    return sum(1 for e in entries[start:] if e["type"] == "message"
               and e["message"]["role"] in ("user", "assistant", "toolResult")
               and e["message"].get("stopReason") not in ("error", "aborted"))


def main_requests(fake: FakeUpstream) -> list[dict[str, Any]]:
    bodies = [orjson.loads(r.body) for r in fake.chat_requests()]
    return [b for b in bodies if not identify(None, {}, b).is_summarization]


@pytest.fixture
def floor_proxy(fake: FakeUpstream, tmp_path: Path) -> Any:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "floor.toml").write_text(RULES)
    sessions = tmp_path / "pi" / "sessions"
    sessions.mkdir(parents=True)
    process = ProxyProcess(fake.url, "--sessions", str(sessions), "--rules", str(rules))
    yield process, tmp_path / "pi"
    process.stop()


def drive(pi: PiAgent, fake: FakeUpstream) -> int:
    """The turns, stopping at the first turn after a compaction; returns how many ran."""
    for done, message in enumerate(TURNS, 1):
        pi.turn(message)
        if compactions(pi) and done < len(TURNS):
            pi.turn(TURNS[done])
            return done + 1
    return len(TURNS)


def test_pi_compaction_then_new_session(floor_proxy: Any, fake: FakeUpstream,
                                        tmp_path: Path, pi_prompt: PiPrompts) -> None:
    proxy, home = floor_proxy
    window = pi_prompt(PI_VERSION).tokens + ROOM_TOKENS
    fake.reset()
    fake.behaviour = AgentBehaviour()
    # the URL the README shows (its agent prefix too), at this proxy
    pi = PiAgent(home, url_at(provider_shown("pi-models.json")["baseUrl"], proxy.url),
                 context_window=window)
    turns = drive(pi, fake)
    assert compactions(pi) >= 1, "Pi never compacted: make the turns longer"
    after = main_requests(fake)[-1]
    signals = identify(None, {}, after)
    assert signals.summary_index == 1, "the request after compaction carries Pi's summary"
    entries = pi.entries()
    kept_from = [e for e in entries if e["type"] == "compaction"][-1]["firstKeptEntryId"]
    own = raw_entries(entries, kept_from) - 1  # the reply to this request came after it
    assert own < N, "Pi alone keeps fewer than N raw messages"
    raw = [m for m in after["messages"][2:] if is_counted(m)]
    assert len(raw) >= N > own
    assert "follow this summary verbatim" in after["messages"][1]["content"][0]["text"]
    assert proxy.sample("tailfloor_rewrites_total", kind="floor") >= 1
    # the README's path prefix named the agent
    assert proxy.sample("tailfloor_tokens_total", agent="pi") > 0

    # A new Pi session in the same directory: its first request carries the old tail.
    before = len(fake.chat_requests())
    pi.turn("A new session: hello again", new_session=True)
    first = orjson.loads(fake.chat_requests()[before].body)
    texts = [str(m.get("content")) for m in first["messages"]]
    assert "previous session" in texts[1]
    assert "A new session: hello again" in texts[-1]
    carried = [m for m in first["messages"][2:-2] if is_counted(m)]
    assert len(carried) >= N
    assert first["messages"][-2]["content"][0]["text"].startswith("[tailfloor] End")
    assert proxy.sample("tailfloor_rewrites_total", kind="carry") >= 1
    assert proxy.sample("tailfloor_identification_total", method="fingerprint") >= 1

    # The same turns straight to the fake: Pi compacts at least as often without tailfloor.
    fake.reset()
    fake.behaviour = AgentBehaviour()
    direct = PiAgent(tmp_path / "direct", fake.url + "/v1", context_window=window)
    for message in TURNS[:turns]:
        direct.turn(message)
    print(f"compactions over {turns} turns: behind tailfloor {compactions(pi)}, "
          f"direct {compactions(direct)}")
    assert compactions(pi) <= compactions(direct)
    fake.behaviour = None


def test_pi_new_session_with_affinity_headers(floor_proxy: Any, fake: FakeUpstream) -> None:
    proxy, home = floor_proxy
    fake.reset()
    fake.behaviour = AgentBehaviour()
    pi = PiAgent(home, proxy.url + "/v1", affinity_headers=True)
    for message in TURNS[:4]:
        pi.turn(message)
    old = pi.session_files()[0].name.split("_", 1)[1].removesuffix(".jsonl")
    before = len(fake.chat_requests())
    pi.turn("Fresh session with affinity headers", new_session=True)
    received = fake.chat_requests()[before]
    new = received.headers["session_id"]
    assert new != old
    first = orjson.loads(received.body)
    assert "previous session" in str(first["messages"][1]["content"])
    carried = [m for m in first["messages"][2:-2] if is_counted(m)]
    assert len(carried) >= min(N, raw_entries(pi.entries(pi.session_files()[0])))
    # The next turn of the new session still carries it (its transcript now links to the old).
    pi.turn("Second turn of the fresh session")
    second = main_requests(fake)[-1]
    assert "previous session" in str(second["messages"][1]["content"])
    fake.behaviour = None

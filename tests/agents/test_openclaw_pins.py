"""Pinned messages on the real OpenClaw gateway (2026.9.6), live: turn 2 pins "Leave the
database alone...", long turns follow until OpenClaw compacts; the first request after the
compaction holds the pin verbatim right after OpenClaw's summary; after ``sessions.reset``
the new segment's requests hold it; after ``!unpin`` (and a turn for the watcher's lag) it
is gone. ``LIVE_RUNS`` runs, in OpenClaw's default configuration (no affinity headers).

The oracle is the upstream's recording of what it received, and OpenClaw's own store (the
pin is in the session's transcript, as the user wrote it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.agents.live_proxy import LIVE_RUNS, openclaw_live
from tests.agents.openclaw_agent import Agent, Gateway
from tests.agents.test_openclaw_live import (
    INTERNAL,
    RULES,
    Run,
    Traffic,
    ask,
    compactions,
    store_events,
)
from tests.conftest import ProxyProcess
from tests.evidence import Evidence
from tests.fake_behaviour import is_summarization, text_of
from tests.fake_upstream import FakeUpstream

AGENT = Agent("main")
PIN = "!pin Leave the database alone. Today, we are only editing documentation."
PINNED = "[tailfloor] Pinned by the user earlier in this conversation:\n\n" + PIN


@pytest.fixture(scope="module")
def live(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[FakeUpstream, ProxyProcess, Gateway]]:
    with openclaw_live(fake, tmp_path_factory.mktemp("openclaw-pins"), RULES, [AGENT],
                       idle_minutes=600) as live:
        yield live


def pinned_at(body: dict[str, Any]) -> int | None:
    found = [i for i, m in enumerate(body["messages"]) if text_of(m.get("content")) == PINNED]
    assert len(found) <= 1, "the pin went in twice"
    return found[0] if found else None


def asking(body: dict[str, Any], words: str) -> bool:
    """A main request whose newest user message says ``words``."""
    users = [m for m in body["messages"] if m.get("role") == "user"
             and INTERNAL not in text_of(m.get("content"))]  # OpenClaw's context block
    return not is_summarization(body["messages"]) and bool(users) and \
        words in text_of(users[-1].get("content"))


def test_a_pin_survives_openclaw_s_compaction_and_reset_until_unpinned(
        live: tuple[FakeUpstream, ProxyProcess, Gateway], evidence: Evidence) -> None:
    fake, proxy, gateway = live
    evidence.add_fake(fake)
    evidence.add("tailfloor.log", proxy.logs)
    evidence.add("gateway.log", gateway.logs)
    report = []
    for r in range(LIVE_RUNS):
        run = Run(AGENT, r, f"agent:main:p{r}")
        tag = f"[pins run {r}]"
        ask(gateway, run, f"Hello, a first turn {tag}.")
        ask(gateway, run, PIN)
        sid = gateway.session_id(AGENT.id, run.key)
        for i in range(20):
            ask(gateway, run, f"A LONG_REPLY please ({i}) {tag}")
            if compactions(gateway.state, AGENT.id, sid):
                break
        else:
            raise AssertionError(f"{run.key}: OpenClaw never compacted")
        ask(gateway, run, f"After the compaction {tag}.")
        gateway.call("sessions.reset", {"key": run.key})
        ask(gateway, run, f"A new segment starts here {tag}.")
        ask(gateway, run, "!unpin database")
        ask(gateway, run, f"A turn after the unpin {tag}.")
        ask(gateway, run, f"And one more {tag}.")
        events = store_events(gateway.state, AGENT.id, sid)
        assert any(PIN in orjson.dumps(e).decode() for e in events), "the pin is not stored"
        received = [{"headers": dict(x.headers), "body": x.json()} for x in fake.chat_requests()]
        mine = [item["body"] for item, _sid in Traffic(received).of(run.key)]
        assert mine, f"no request of {run.key}: {[Traffic(received).items[:3]]}"
        before = [b for b in mine if asking(b, "LONG_REPLY")]
        after = next(b for b in mine if asking(b, f"After the compaction {tag}"))
        segment = next(b for b in mine if asking(b, f"A new segment starts here {tag}"))
        unpinned = next(b for b in mine if asking(b, f"And one more {tag}"))
        where = f"OpenClaw run {r}"
        summary_at = next(i for i, m in enumerate(after["messages"]) if "compacted into the "
                          "following summary" in text_of(m.get("content")))
        assert pinned_at(after) == summary_at + 1, \
            f"{where}: {[text_of(m.get('content'))[:50] for m in after['messages']]}"
        # while OpenClaw's own requests held it raw (behind its timestamp), nothing was added
        assert pinned_at(before[0]) is None, where
        assert pinned_at(segment) is not None, f"{where}: not there after the reset"
        assert pinned_at(unpinned) is None, f"{where}: still pinned after !unpin"
        report.append({"after_compaction": pinned_at(after), "after_reset": pinned_at(segment)})
    print(f"\nOpenClaw pins per run: {report}")

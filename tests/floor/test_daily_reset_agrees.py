"""A daily reset still carries: the agents' real system prompts a day apart (only the date
differs) agree with the fingerprint the session's own requests recorded, and a stranger's
prompt does not. The prompts are real requests of Pi 0.73.1 and OpenClaw 2026.9.6
(tests/fixtures/prompts/a-day-apart-2026-11-30.json); the next day's is made by the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.identity.prompt_prints import fingerprint
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, Transcript, chat, conversation, put, request_for, rules

PROMPTS = json.loads((Path(__file__).parents[1] / "fixtures" / "prompts"
                      / "a-day-apart-2026-11-30.json").read_text())
SESSION = "01a22a55-0000-7000-8000-0000000000dd"
AGENTS = ["pi-0.73.1", "openclaw-2026.9.6"]


def prompt(agent: str, day: str = "2026-11-30") -> tuple[dict[str, Any], list[Any]]:
    system = json.loads(json.dumps(PROMPTS[agent]["system"]).replace("2026-11-30", day))
    return system, PROMPTS[agent]["tools"]


def hello(system: dict[str, Any], tools: list[Any]) -> dict[str, Any]:
    return {"model": "fake-model", "tools": tools,
            "messages": [system, {"role": "user", "content": "good morning"}]}


@pytest.mark.parametrize("agent", AGENTS)
def test_the_next_day_s_prompt_has_the_same_fingerprint(agent: str) -> None:
    today, tools = prompt(agent)
    tomorrow, _ = prompt(agent, "2026-12-01")
    assert "2026-12-01" in json.dumps(tomorrow) and today != tomorrow
    assert fingerprint(hello(today, tools)) == fingerprint(hello(tomorrow, tools))
    other = {**today, "content": "You are Mallory's assistant. Current date: 2026-12-01"}
    assert fingerprint(hello(other, tools)) != fingerprint(hello(today, tools))


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("caller", ["agent", "stranger"])
def test_a_daily_reset_carries_to_the_agent_only(agent: str, caller: str) -> None:
    t = Transcript(SESSION)
    conversation(t, 12)
    t.reset()
    catalog = Catalog()
    put(catalog, t)
    floor = FloorHarness(Holder(rules(n=8)), TokenCounter(), catalog, single_tenant=True)
    today, tools = prompt(agent)
    record = catalog.full(SESSION)
    assert record is not None and record.resets
    closed = [m for r in catalog.tail(SESSION, 200, before=record.resets[-1].entry_id)
              for m in r.messages]
    # the session's own last request before the reset: its fingerprint is recorded
    floor.decide(chat({**request_for(catalog, SESSION, sys=today), "tools": tools,
                       "messages": [today, *closed]}), {})
    tomorrow, _ = prompt(agent, "2026-12-01")
    if caller == "stranger":
        tomorrow = {**tomorrow, "content": "You are Mallory's assistant. Current date: "
                    "2026-12-01"}
    decision = floor.decide(chat(hello(tomorrow, tools)), {"x-tailfloor-session": SESSION})
    if caller == "agent":
        assert decision.kind == "carry" and decision.added_raw >= 8, decision.verdict
    else:
        assert decision.kind == "none" and not decision.added, decision.verdict

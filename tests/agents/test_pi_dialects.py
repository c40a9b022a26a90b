"""The real Pi agent, both releases, on ``openai-responses`` and ``anthropic-messages`` against
the fake upstream directly (no proxy): Pi's own providers parse the fake's dialects (text,
reasoning, a tool round trip, usage), so the live tests through tailfloor can stand on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agents.pi_agent import PI_LATEST, PI_VERSION
from tests.agents.pi_dialects import (
    ANTHROPIC,
    APIS,
    RESPONSES,
    dialect_agent,
    last_assistant_text,
    requests_of,
)
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream


@pytest.mark.parametrize("version", [PI_VERSION, PI_LATEST])
@pytest.mark.parametrize("api", APIS)
def test_pi_speaks_each_dialect_to_the_fake(clean_fake: FakeUpstream, tmp_path: Path,
                                             api: str, version: str) -> None:
    clean_fake.behaviour = AgentBehaviour(reasoning=True)
    agent = dialect_agent(tmp_path, clean_fake.url, api, version=version, reasoning=True)
    assert "Fake reply #1" in agent.turn("Turn one: hello")
    assert "The tool returned: # a project" in agent.turn("Turn two: USE_TOOL:read")
    sent = requests_of(clean_fake, api)
    assert len(sent) == 3 and not [r for r in clean_fake.received if r not in sent]
    assert sent[0].path == ("/v1/responses" if api == RESPONSES else "/v1/messages")
    last = sent[-1].json()
    if api == RESPONSES:
        kinds = [item.get("type", "message") for item in last["input"]]
        assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
    else:
        assert last["messages"][-1]["content"][0]["type"] == "tool_result"
        assert [b["type"] for b in last["messages"][-2]["content"]] == ["thinking", "tool_use"]
    assert last_assistant_text(agent) == "The tool returned: # a project\n"
    usage = [e["message"]["usage"] for e in agent.entries()
             if e.get("type") == "message" and e["message"].get("role") == "assistant"]
    assert usage and all(u["input"] > 0 and u["output"] > 0 for u in usage)
    if api == ANTHROPIC:
        assert all(u["cacheRead"] == 0 for u in usage)  # sized usage reports no cache

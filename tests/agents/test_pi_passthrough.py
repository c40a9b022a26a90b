"""The real Pi agent through tailfloor: turns, a tool call and its own compaction work."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.agents.pi_agent import PiAgent
from tests.conftest import ProxyProcess
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream


def test_pi_runs_through_tailfloor(proxy: ProxyProcess, clean_fake: FakeUpstream,
                                   tmp_path: Path) -> None:
    clean_fake.behaviour = AgentBehaviour()
    pi = PiAgent(tmp_path, proxy.url + "/v1")
    assert "Fake reply #1" in pi.turn("Turn one: hello")
    assert "hello-from-tool" in pi.turn("Turn two: USE_TOOL:bash")
    requests = [orjson.loads(r.body) for r in clean_fake.chat_requests()]
    assert all(r["stream"] is True for r in requests)
    roles = [m["role"] for m in requests[-1]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool"]
    types = [e["type"] for e in pi.entries()]
    assert types.count("message") == 6  # user, assistant, user, tool call, result, answer
    assert proxy.sample("tailfloor_tokens_total", model="fake-model", type="input") > 0

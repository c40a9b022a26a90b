"""The floor in a real tailfloor process in front of the fake upstream."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from proxy.floor.restore import is_counted
from proxy.transcripts.catalog import Catalog
from tests.conftest import ProxyProcess
from tests.fake_behaviour import AgentBehaviour, size_usage
from tests.fake_upstream import FakeUpstream
from tests.floor.synthetic import Transcript, conversation, put, request_for, write_jsonl
from tests.inprocess import InProcessProxy

SID = "01a22a55-0000-7000-8000-00000000abcd"
RULES = """[defaults]
mode = "{mode}"
min_tail_messages = 10

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.0
"""


def setup(tmp_path: Path, mode: str) -> tuple[Path, Path, dict[str, Any]]:
    t = Transcript(SID)
    conversation(t, 14)
    t.compaction("## Goal\nkeep going", t.message_ids()[-5])
    t.user("the question after compaction")
    write_jsonl(tmp_path / "sessions", t)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "floor.toml").write_text(RULES.format(mode=mode))
    catalog = Catalog()
    put(catalog, t)
    return tmp_path / "sessions", rules, request_for(catalog, SID)


def post(proxy: ProxyProcess, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    raw = orjson.dumps({**body, "stream": False})
    request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=raw,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return orjson.loads(response.read()), response.headers["x-tailfloor"]


def test_enforce_restores_and_reports_the_client_usage(fake: FakeUpstream,
                                                       tmp_path: Path) -> None:
    fake.reset()
    fake.behaviour = AgentBehaviour()
    sessions, rules, body = setup(tmp_path, "enforce")
    proxy = InProcessProxy(fake, "--sessions", str(sessions), "--rules", str(rules))
    try:
        answer, verdict = post(proxy, body)
        assert verdict.startswith("floor; restored=")
        sent = orjson.loads(fake.chat_requests()[-1].body)
        assert sum(1 for m in sent["messages"][2:] if is_counted(m)) >= 10
        assert sent["messages"][-3:] == body["messages"][-3:]
        upstream = size_usage(sent, "")["prompt_tokens"]
        assert answer["usage"]["prompt_tokens"] < upstream
        assert proxy.sample("tailfloor_rewrites_total", kind="floor") == 1
        assert proxy.sample("tailfloor_tail_messages_injected_total") > 0
        assert proxy.sample("tailfloor_identification_total", method="summary") == 1
        # A bad edit of the rules keeps the rules in force.
        (rules / "floor.toml").write_text("[defaults]\nmode = 12\n")
        deadline = time.monotonic() + 5
        while proxy.sample("tailfloor_rules_reloads_total", outcome="error") < 1:
            assert time.monotonic() < deadline, "bad rules edit not noticed"
            time.sleep(0.05)
        _answer, verdict = post(proxy, body)
        assert verdict.startswith("floor; restored=")
    finally:
        fake.behaviour = None
        proxy.stop()


def test_shadow_mode_sends_the_original_bytes(fake: FakeUpstream, tmp_path: Path) -> None:
    fake.reset()
    sessions, rules, body = setup(tmp_path, "shadow")
    proxy = InProcessProxy(fake, "--sessions", str(sessions), "--rules", str(rules))
    try:
        raw = orjson.dumps(body)
        request = urllib.request.Request(proxy.url + "/v1/chat/completions", data=raw,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["x-tailfloor"].startswith("shadow; floor; restored=")
            response.read()
        assert fake.chat_requests()[-1].body == raw
        assert proxy.sample("tailfloor_rewrites_total", kind="shadow") == 1
        assert proxy.sample("tailfloor_tail_messages_injected_total") == 0
        assert "shadow; floor" in proxy.logs()
    finally:
        proxy.stop()

"""Pi 1.x cache warming through tailfloor: each refresh gets exactly the rewrite of the request
it repeats, which is the prefix of the real request that follows, and starts nothing (no
summary of tailfloor's own, no carry where its request had none).

Pi re-sends its last request capped at one output token while it sits idle (``cacheWarming``
"idle", a model with a prompt-cache lifetime); the test gives the fake model an 11 s lifetime
and prices that make warming pay, so Pi refreshes about once a second. Scenarios: after Pi's
compaction (the floor restores) and in the new session after ``new_session`` (the floor
carries), default configuration and affinity headers, ``LIVE_RUNS`` runs each. The oracle is the
upstream's log: what tailfloor sent for the real requests and for the refreshes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.live_proxy import LIVE_RUNS, watched_proxy
from tests.agents.pi_agent import PI_LATEST, PiAgent, release
from tests.agents.pi_rpc import PiRpc
from tests.agents.sizing import PiPrompts
from tests.evidence import Evidence
from tests.fake_behaviour import AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream

RULES = """[defaults]
min_tail_messages = 8

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.3
"""
WARMING_MODEL = {"promptCache": {"short": 11},
                 "cost": {"input": 1000, "output": 1000, "cacheRead": 1, "cacheWrite": 0}}
WARMS = 2  # refreshes awaited while Pi sits idle
WARM_WAIT = 20.0  # seconds they may take at most (Pi refreshes about once a second here)
ROOM_TOKENS = 14650  # above Pi's measured fixed prompt: it compacts after a few long replies


def _idle_until_warmed(fake: FakeUpstream) -> None:
    """Pi sits idle until it has refreshed the cache WARMS times (the fake saw them)."""
    def warms() -> int:
        return sum(_kind(orjson.loads(r.body)) == "warm" for r in list(fake.chat_requests()))
    target = warms() + WARMS
    deadline = time.monotonic() + WARM_WAIT
    while warms() < target:
        assert time.monotonic() < deadline, \
            f"Pi sent {warms() - target + WARMS} of {WARMS} cache warms in {WARM_WAIT} s"
        time.sleep(0.05)


def _turns(rpc: PiRpc, fake: FakeUpstream, run: int) -> None:
    rpc.prompt(f"Hello, a first turn [run {run}].")
    for i in range(12):
        if rpc.prompt(f"A LONG_REPLY please ({i}) [run {run}]"):
            break
    else:
        raise AssertionError("Pi never compacted")
    rpc.prompt(f"The first question after the compaction [run {run}].")
    _idle_until_warmed(fake)
    rpc.prompt(f"A second question after the compaction [run {run}].")
    rpc.new_session()
    rpc.prompt(f"A new session starts here [run {run}].")
    _idle_until_warmed(fake)
    rpc.prompt(f"And goes on [run {run}].")


def _kind(body: dict[str, Any]) -> str:
    if is_summarization(body["messages"]):
        return "summary"
    return "warm" if body.get("max_completion_tokens") == 1 else "real"


@pytest.mark.parametrize("affinity", [False, True], ids=["default", "affinity"])
def test_cache_warms_get_the_rewrite_of_the_request_they_repeat(
        fake: FakeUpstream, tmp_path: Path, affinity: bool, pi_prompt: PiPrompts,
        evidence: Evidence) -> None:
    window = pi_prompt(PI_LATEST).tokens + ROOM_TOKENS
    proxy, root = watched_proxy(fake, tmp_path, RULES, evidence)
    seen = []
    try:
        for run in range(LIVE_RUNS):
            fake.reset()
            fake.behaviour = AgentBehaviour()
            pi = PiAgent(tmp_path / f"pi{run}", proxy.url + "/v1", context_window=window,
                         reserve_tokens=11500, keep_recent_tokens=800,
                         affinity_headers=affinity, pi=release(PI_LATEST),
                         settings={"cacheWarming": "idle"}, model_extra=WARMING_MODEL)
            pi.sessions = root / f"run{run}"
            pi.sessions.mkdir()
            rpc = PiRpc(pi)
            try:
                _turns(rpc, fake, run)
            finally:
                rpc.close()
            bodies = [orjson.loads(r.body) for r in fake.chat_requests()]
            kinds = [_kind(b) for b in bodies]
            agents = {r.headers.get("User-Agent", "").split("/")[0]
                      for r, k in zip(fake.chat_requests(), kinds, strict=True)
                      if k == "summary"}
            where = f"run {run}: {kinds}"
            # Pi's own summaries only: nothing of tailfloor's, warms included.
            assert "summary" in kinds and agents == {"pi"}, f"{where} {agents}"
            warms = [i for i, k in enumerate(kinds) if k == "warm"]
            assert len(warms) >= 2, where
            carried = restored = 0
            for i in warms:
                before = max(j for j in range(i) if kinds[j] == "real")
                after = min(j for j in range(i + 1, len(bodies)) if kinds[j] == "real")
                warm = bodies[i]["messages"]
                assert warm == bodies[before]["messages"], f"{where}: warm {i}"
                assert bodies[after]["messages"][:len(warm)] == warm, f"{where}: warm {i}"
                text = orjson.dumps(warm).decode()
                carried += "[tailfloor] The " in text
                restored += "follow this summary verbatim" in text
            # One scenario each: the floor restored after the compaction, carried after the
            # new session, and the warms repeated those rewrites.
            assert carried >= 1 and restored >= 1, where
            seen.append(len(warms))
    finally:
        fake.behaviour = None
        proxy.stop()
    print(f"affinity={affinity}: cache warms per run {seen}")

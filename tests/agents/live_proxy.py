"""tailfloor in front of the fake upstream for a live agent test: a fresh transcript root,
the test's rules, DEBUG logs, and the evidence a failure keeps (the fake's record, the
proxy's log, the transcripts)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.agents.openclaw_agent import Agent, Gateway
from tests.conftest import ProxyProcess
from tests.evidence import Evidence
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream

# Each live scenario runs this many times in a row, in one agent process: a race that fails
# one run in three shows in more than half of the CI runs, and every CI run of every change
# repeats it. Three runs each took the whole suite past CI's 20 minutes.
LIVE_RUNS = 2


def watched_proxy(fake: FakeUpstream, tmp_path: Path, rules_text: str, evidence: Evidence,
                  *extra: str, env: dict[str, str] | None = None
                  ) -> tuple[ProxyProcess, Path]:
    """The proxy and the root it watches (empty: the agents write into it)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "floor.toml").write_text(rules_text)
    root = tmp_path / "sessions"
    root.mkdir()
    proxy = ProxyProcess(fake.url, "--sessions", str(root), "--rules", str(rules),
                         "--log-level", "DEBUG", *extra, env=env)
    evidence.add_fake(fake)
    evidence.add("tailfloor.log", proxy.logs)
    evidence.add_files("transcripts.jsonl", lambda: root.rglob("*.jsonl"))
    return proxy, root


@contextlib.contextmanager
def openclaw_live(fake: FakeUpstream, home: Path, rules_text: str, agents: list[Agent], *,
                  idle_minutes: int, models: tuple[str, ...] = (), extra: tuple[str, ...] = ()
                  ) -> Iterator[tuple[FakeUpstream, ProxyProcess, Gateway]]:
    """A real OpenClaw gateway whose agents' providers point at tailfloor, which watches
    the gateway's state directory (``home/.openclaw``)."""
    rules = home / "rules"
    rules.mkdir()
    (rules / "floor.toml").write_text(rules_text)
    (home / ".openclaw").mkdir()
    fake.reset()
    fake.behaviour = AgentBehaviour()
    proxy = ProxyProcess(fake.url, "--sessions", str(home / ".openclaw"), "--rules", str(rules),
                         "--log-level", "DEBUG", *extra)
    gateway = None
    try:
        gateway = Gateway(home, proxy.url, agents, idle_minutes=idle_minutes, models=models)
        yield fake, proxy, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        proxy.stop()
        fake.behaviour = None

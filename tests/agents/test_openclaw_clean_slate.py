"""A clean slate on the real OpenClaw gateway (2026.9.6), live: after ``sessions.reset``, a
first message starting with ``--clean`` starts a segment whose requests carry nothing of the
one before and hold no marker; without the marker (the control) the reset carries.
``LIVE_RUNS`` runs each, in OpenClaw's default configuration.

Seen here first: a gateway ``agent`` turn passes ``/new --clean <text>`` to the model as
plain text in the same session (the slash command is not parsed on that path; the test
checks that too, so a release that starts parsing it shows up). The oracle is the
upstream's recording of what it received.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agents.live_proxy import LIVE_RUNS, openclaw_live
from tests.agents.openclaw_agent import Agent, Gateway
from tests.agents.test_openclaw_live import INTERNAL, RULES, Run, ask
from tests.conftest import ProxyProcess
from tests.evidence import Evidence
from tests.fake_behaviour import is_summarization, text_of
from tests.fake_upstream import FakeUpstream

AGENT = Agent("main")
CARRIED = "[tailfloor] The "


@pytest.fixture(scope="module")
def live(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[FakeUpstream, ProxyProcess, Gateway]]:
    with openclaw_live(fake, tmp_path_factory.mktemp("openclaw-clean"), RULES, [AGENT],
                       idle_minutes=600) as live:
        yield live


def user_texts(body: dict[str, Any]) -> list[str]:
    return [text_of(m.get("content")) for m in body["messages"]
            if m.get("role") == "user" and INTERNAL not in text_of(m.get("content"))]


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "control"])
def test_new_with_the_marker_starts_a_clean_session(
        live: tuple[FakeUpstream, ProxyProcess, Gateway], evidence: Evidence,
        clean: bool) -> None:
    fake, proxy, gateway = live
    evidence.add_fake(fake)
    evidence.add("tailfloor.log", proxy.logs)
    evidence.add("gateway.log", gateway.logs)
    for r in range(LIVE_RUNS):
        run = Run(AGENT, r, f"agent:main:{'c' if clean else 'k'}{r}")
        tag = f"[{'clean' if clean else 'control'} run {r}]"
        for i in range(5):
            ask(gateway, run, f"An earlier question {i} {tag}.")
        ask(gateway, run, f"/new --clean Not a command here {tag}.")
        first = f"Start afresh {tag}."
        gateway.call("sessions.reset", {"key": run.key})
        ask(gateway, run, ("--clean " if clean else "") + first)
        ask(gateway, run, f"And a second turn {tag}.")
        bodies = [x.json() for x in fake.chat_requests()]
        slash = [b for b in bodies if any(f"/new --clean Not a command here {tag}" in t
                                          for t in user_texts(b))]
        assert slash, "OpenClaw parsed /new on a gateway turn: document and test that path"
        fresh = [b for b in bodies if not is_summarization(b["messages"])
                 and any(first in t for t in user_texts(b))]
        where = f"OpenClaw {tag}"
        assert fresh, f"{where}: OpenClaw never sent the new session's first text"
        if clean:
            for b in fresh:
                assert not any(CARRIED in json.dumps(m.get("content")) for m in b["messages"]), \
                    f"{where}: carried"
                assert not any("--clean" in t for t in user_texts(b)), \
                    f"{where}: {user_texts(b)}"
        else:
            assert any(CARRIED in json.dumps(m.get("content")) for m in fresh[0]["messages"]), \
                f"{where}: the control did not carry: {user_texts(fresh[0])}"

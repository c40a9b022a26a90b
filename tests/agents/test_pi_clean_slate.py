"""A clean slate on the real Pi agent (0.73.1 and 1.6.0), live, in its default
configuration: after ``new_session``, a first prompt starting with ``--clean`` gets nothing
of the previous session (the upstream receives no carried message and no marker, the rest
of the text as typed), and neither do the new session's later requests; the inspector names
the session a clean slate; without the marker the same steps carry (the control).
``LIVE_RUNS`` runs per release.

The oracle is the upstream's recording of what it received and Pi's own transcript (which
keeps the prompt as typed, marker included).
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
from tests.agents.test_pi_cache_warming import RULES
from tests.evidence import Evidence
from tests.fake_behaviour import AgentBehaviour
from tests.fake_upstream import FakeUpstream
from tests.inspector.client import fetch, session_json, session_url

CARRIED = "[tailfloor] The "


def carried(body: dict[str, Any]) -> bool:
    return any(CARRIED in json.dumps(m.get("content")) for m in body["messages"])


def user_texts(body: dict[str, Any]) -> list[str]:
    out = []
    for m in body["messages"]:
        if m.get("role") == "user":
            content = m.get("content")
            out.append(content if isinstance(content, str) else "".join(
                p.get("text", "") for p in content or [] if isinstance(p, dict)))
    return out


@pytest.mark.parametrize("version", [PI_VERSION, PI_LATEST])
def test_a_clean_slate_after_new_session_carries_nothing(
        fake: FakeUpstream, tmp_path: Path, version: str, evidence: Evidence) -> None:
    proxy, root = watched_proxy(fake, tmp_path, RULES, evidence)
    try:
        for run in range(LIVE_RUNS):
            for clean in (True, False):
                fake.reset()
                fake.behaviour = AgentBehaviour()
                name = f"pi{run}-{'clean' if clean else 'carry'}"
                pi = PiAgent(tmp_path / name, proxy.url + "/v1", pi=release(version))
                pi.sessions = root / name
                pi.sessions.mkdir()
                rpc = PiRpc(pi)
                first = f"Start afresh, please [{name}]."
                try:
                    for i in range(6):
                        rpc.prompt(f"An earlier question {i} [{name}].")
                    rpc.new_session()
                    rpc.prompt(("--clean " if clean else "") + first)
                    rpc.prompt(f"And a second turn [{name}].")
                finally:
                    rpc.close()
                bodies = [orjson.loads(r.body) for r in fake.chat_requests()]
                new_id = pi.session_files()[-1].stem.split("_", 1)[1]
                inspected = session_json(proxy, new_id)["session"]
                assert inspected["clean_slate"] is clean, f"{name}: {inspected}"
                _, _, page = fetch(session_url(proxy, new_id))
                assert (b"Clean slate:" in page) is clean, name
                fresh = [b for b in bodies if any(first in t for t in user_texts(b))]
                assert len(fresh) == 2, name
                where = f"pi {version} {name}"
                if clean:
                    assert not any(carried(b) for b in fresh), where
                    for b in fresh:
                        texts = user_texts(b)
                        assert first in texts and not any("--clean" in t for t in texts), \
                            f"{where}: {texts}"
                    _old, new = pi.session_files()
                    assert "--clean " + first in new.read_text()  # Pi keeps what was typed
                    assert proxy.sample("tailfloor_carry_total", outcome="clean_slate") >= 2
                else:
                    assert all(carried(b) for b in fresh), where
    finally:
        fake.behaviour = None
        proxy.stop()

"""The real Pi agent in RPC mode behind a real ``tailfloor serve``, on ``openai-responses`` and
``anthropic-messages`` providers, in Pi's default configuration (no affinity headers, no
message threads, a reasoning model at thinking level ``low`` as Claude and GPT-5 are): the
floor after Pi's own compaction, the carry into a new session, overflow recovery.

Each scenario runs ``LIVE_RUNS`` times in a row (a race that fails one run in three shows). The
oracle is Pi's own transcript, read by the test, and the request the fake upstream received in
the dialect's shape (input items, messages): after the compaction the request holds Pi's
summary and then at least min(N, available) raw messages, exactly the transcript's, contiguous,
ending with the new prompt, every tool exchange whole and valid for the dialect; the proxy's
access log says ``floor`` for it (the ``x-tailfloor`` verdict). The new session's first request
carries the old session's tail between tailfloor's notes. An overflow error in the dialect's
own words is recovered by a summarizer call in the same dialect and one retry, and Pi gets the
answer.

Both dialects, both Pi releases; the floor and the carry share each run (six turns, Pi's
``compact``, a prompt, ``new_session``, a prompt). About 90 s for the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents.dialect_views import (
    exchanges_valid,
    history,
    kept_assistants,
    raw_view,
    text_of,
    thinking_turns,
    transcript_raw,
)
from tests.agents.live_proxy import LIVE_RUNS
from tests.agents.pi_agent import PI_LATEST, PI_VERSION, PiAgent
from tests.agents.pi_dialects import (
    ANTHROPIC,
    APIS,
    PATHS,
    RESPONSES,
    compact,
    dialect_agent,
    last_assistant_text,
    requests_of,
)
from tests.agents.pi_rpc import PiRpc
from tests.conftest import ProxyProcess
from tests.fake_behaviour import (
    SUMMARY_MARKER,
    AgentBehaviour,
    is_summarization,
    overflow_error,
)
from tests.fake_dialects import chat_view
from tests.fake_upstream import FakeUpstream, Reply

N = 8
RULES = """[defaults]
min_tail_messages = {n}

[[models]]
pattern = "fake*"
context_window = {window}
encoding = "estimate"
margin = 0.3
"""
# A tool round trip between long replies: Pi keeps about one long reply (keepRecentTokens 800),
# the floor puts back N raw messages, the bash exchange among them.
TURNS = ["Hello, a first turn.", "USE_TOOL:read the readme", "A LONG_REPLY please (1)",
         "USE_TOOL:bash run one command", "A LONG_REPLY please (2)", "A LONG_REPLY please (3)"]
AFTER = "The first question after the compaction."
NEW_SESSION = "A new session starts here."
SHORT = {RESPONSES: "responses", ANTHROPIC: "messages"}


def summarizing(api: str, body: dict[str, Any]) -> bool:
    return is_summarization(chat_view(body, SHORT[api])["messages"])


def verdicts(proxy: ProxyProcess, api: str) -> list[str]:
    """The ``x-tailfloor`` verdict of each request on the dialect's route, in order."""
    out = []
    for line in proxy.logs().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("logger") == "tailfloor.access" and str(entry.get("msg", "")).startswith(
                f"POST /v1{PATHS[api]} "):
            out.append(str(entry.get("verdict", "")))
    return out


def pi_home(tmp_path: Path, root: Path, url: str, api: str, *, version: str, run: int
            ) -> PiAgent:
    agent = dialect_agent(tmp_path / f"pi{run}", url, api, version=version, reasoning=True,
                          context_window=32000, keep_recent_tokens=800)
    agent.sessions = root / f"run{run}"
    agent.sessions.mkdir()
    return agent


def start_proxy(fake: FakeUpstream, tmp_path: Path, *, window: int = 200000,
                sessions: Path | None = None) -> ProxyProcess:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "floor.toml").write_text(RULES.format(n=N, window=window))
    extra = ["--sessions", str(sessions)] if sessions is not None else []
    return ProxyProcess(fake.url, *extra, "--rules", str(rules), "--state",
                        str(tmp_path / "state"), "--log-level", "DEBUG", "--access-log")


def check_floor(api: str, body: dict[str, Any], transcript: Path, where: str) -> int:
    """The first request after the compaction: Pi's summary, then at least min(N, available)
    raw messages exactly as in the transcript, contiguous, ending with the new prompt; Pi's own
    messages as Pi sent them (each of its assistant turns with its reasoning: the fake reasons
    on every answer), the restored ones before them (rendered without)."""
    theirs = transcript_raw(transcript)
    items = history(api, body)
    problem = exchanges_valid(api, items, thinking=True)
    assert problem is None, f"{where}: {problem}"
    assert "<summary>" in text_of(items[0]), f"{where}: no summary first"
    ours = raw_view(api, items[1:])
    assert ours[-1][0] == "user" and AFTER in ours[-1][1], f"{where}: ends with {ours[-1]}"
    upto = max(i for i, m in enumerate(theirs) if m == ours[-1]) + 1
    assert ours == theirs[upto - len(ours):upto], f"{where}: not the transcript's\n{ours}"
    assert len(ours) >= min(N, upto), f"{where}: {len(ours)} raw messages"
    assert any(role == "tool" for role, _ in ours), f"{where}: the tool exchange is not back"
    kept = kept_assistants(transcript, AFTER)
    turns = thinking_turns(api, items[1:])
    assert turns == [False] * (len(turns) - kept) + [True] * kept, \
        f"{where}: reasoning per assistant turn {turns}, Pi kept {kept}"
    return len(ours)


def check_carry(api: str, body: dict[str, Any], before: list[tuple[str, str]], where: str
                ) -> int:
    """The new session's first request: the old session's last raw messages between
    tailfloor's two notes, then the new prompt."""
    items = history(api, body)
    problem = exchanges_valid(api, items, thinking=True)
    assert problem is None, f"{where}: {problem}"
    raw = raw_view(api, items)
    texts = [text for _role, text in raw]
    assert texts[0].startswith("[tailfloor] The "), f"{where}: {texts[0][:80]}"
    end = next(i for i, t in enumerate(texts) if t.startswith("[tailfloor] End of"))
    carried, own = raw[1:end], raw[end + 1:]
    assert carried == before[len(before) - len(carried):], f"{where}: not the old session's end"
    assert len(carried) >= min(N, len(before)), f"{where}: {len(carried)} carried"
    assert own and NEW_SESSION in own[-1][1], f"{where}: {own}"
    assert not any(thinking_turns(api, items)), f"{where}: reasoning in what was carried"
    return len(carried)


@pytest.mark.parametrize("version", [PI_VERSION, PI_LATEST])
@pytest.mark.parametrize("api", APIS)
def test_floor_after_pi_compacts_and_carry_into_a_new_session(
        fake: FakeUpstream, tmp_path: Path, api: str, version: str) -> None:
    root = tmp_path / "sessions"
    root.mkdir()
    proxy = start_proxy(fake, tmp_path, sessions=root)
    floors: list[int] = []
    carries: list[int] = []
    try:
        for run in range(LIVE_RUNS):
            fake.reset()
            fake.behaviour = AgentBehaviour(reasoning=True)
            pi = pi_home(tmp_path, root, proxy.url, api, version=version, run=run)
            rpc = PiRpc(pi)
            try:
                for turn in TURNS:
                    assert not rpc.prompt(f"{turn} [run {run}]"), "Pi compacted on its own"
                compact(rpc)
                rpc.prompt(f"{AFTER} [run {run}]")
                rpc.new_session()
                rpc.prompt(f"{NEW_SESSION} [run {run}]")
            finally:
                rpc.close()
            sent = requests_of(fake, api)
            assert len(sent) == len(fake.received), "a request on another route"
            bodies = [r.json() for r in sent]
            marks = verdicts(proxy, api)
            assert len(marks) >= len(bodies), marks
            marks = marks[-len(bodies):]
            # Pi 1.x may make two summarizer calls for one compaction (the turn it splits).
            cut = max(i for i, b in enumerate(bodies) if summarizing(api, b))
            assert cut == len(bodies) - 3, f"run {run}: {len(bodies)} requests, summary at {cut}"
            old, new = pi.session_files()
            floors.append(check_floor(api, bodies[cut + 1], old,
                                      f"run {run}, after the compaction"))
            assert marks[cut + 1].startswith("floor"), marks
            carries.append(check_carry(api, bodies[cut + 2], transcript_raw(old),
                                       f"run {run}, the new session"))
            assert marks[cut + 2].startswith("carry"), marks
            assert transcript_raw(new)[-1][0] == "assistant"
    except AssertionError as failure:
        decisions = [line for line in proxy.logs().splitlines()
                     if '"tailfloor.floor"' in line or "transcripts" in line]
        raise AssertionError(f"{failure}\nproxy floor log:\n" + "\n".join(decisions[-40:])
                             ) from failure
    finally:
        fake.behaviour = None
        proxy.stop()
    print(f"pi {version} {api}: raw messages after the summary per run {floors}, "
          f"carried per run {carries}")


@pytest.mark.parametrize("version", [PI_VERSION, PI_LATEST])
@pytest.mark.parametrize("api", APIS)
def test_overflow_is_recovered_in_the_dialect(fake: FakeUpstream, tmp_path: Path,
                                              api: str, version: str) -> None:
    root = tmp_path / "sessions"
    root.mkdir()
    proxy = start_proxy(fake, tmp_path, window=8192)
    try:
        for run in range(LIVE_RUNS):
            fake.reset()
            fake.behaviour = AgentBehaviour(reasoning=True)
            pi = pi_home(tmp_path, root, proxy.url, api, version=version, run=run)
            rpc = PiRpc(pi)
            try:
                for turn in TURNS[:3]:
                    rpc.prompt(f"{turn} [run {run}]")
                before = len(fake.received)
                fake.script.append(Reply(status=400, error=overflow_error(40000, 8192, 9000)))
                rpc.prompt(f"This one overflows [run {run}]")
            finally:
                rpc.close()
            assert len(requests_of(fake, api)) == len(fake.received), "another route"
            tried = fake.received[before:]
            assert [r.path for r in tried] == [f"/v1{PATHS[api]}"] * 3, [r.path for r in tried]
            first, summary, retry = (r.json() for r in tried)
            assert summarizing(api, summary) and not summarizing(api, retry)
            assert not summarizing(api, first)
            # The summarizer's call in the dialect's own shape, the retry with its summary.
            assert ("input" in summary) == (api == RESPONSES) != ("messages" in summary)
            if api == ANTHROPIC:
                assert exchanges_valid(api, summary["messages"]) is None, summary["messages"]
            assert SUMMARY_MARKER in json.dumps(retry)
            assert len(json.dumps(retry)) < len(json.dumps(first))
            assert "This one overflows" in json.dumps(history(api, retry)[-1])
            problem = exchanges_valid(api, history(api, retry), thinking=True)
            assert problem is None, problem
            assert verdicts(proxy, api)[-1].startswith("compacted"), verdicts(proxy, api)[-1]
            assert last_assistant_text(pi).startswith("Fake reply"), last_assistant_text(pi)
            reasons = [m.get("stopReason") for m in (e.get("message") for e in pi.entries())
                       if isinstance(m, dict)]
            assert "error" not in reasons, reasons
        assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == LIVE_RUNS
    except AssertionError as failure:
        raise AssertionError(f"{failure}\nproxy log:\n{proxy.logs()[-4000:]}") from failure
    finally:
        fake.behaviour = None
        proxy.stop()

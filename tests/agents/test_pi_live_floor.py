"""The floor on the real Pi agent in RPC mode, in real time: the first request after Pi's own
compaction, in Pi's default configuration (no session headers) and with affinity headers,
with a text-only tail and with tool calls in it, for N = 8 (and N = 30 in the default
configuration).

Pi writes the new user message to its transcript about 10 ms before it sends the request,
and the watcher sees it after the request has been answered: identification must not wait
for the transcript to be current. Each scenario runs ``LIVE_RUNS`` times in a row (a race
that fails one run in three shows). The oracle is Pi's own transcript, read by the test: the
request after the compaction holds Pi's summary and then at least min(N, available) raw
messages, exactly the transcript's, contiguous, ending with the new prompt, tool pairs intact.
After each run, another client with its own system prompt names each of those sessions on the
same port and gets nothing of them (the upstream receives its bytes unchanged).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agents.live_proxy import LIVE_RUNS, watched_proxy
from tests.agents.pi_agent import PI_LATEST, PI_VERSION, PiAgent, release
from tests.agents.pi_rpc import PiRpc
from tests.agents.sizing import PiPrompts
from tests.conftest import ProxyProcess
from tests.evidence import Evidence
from tests.fake_behaviour import AgentBehaviour, is_summarization
from tests.fake_upstream import FakeUpstream

RULES = """[defaults]
min_tail_messages = {n}

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.3
"""
TEXT_TURNS = ["Hello, a first turn.", "USE_TOOL:bash run one early command",
              "A LONG_REPLY please (1)", "A LONG_REPLY please (2)", "A LONG_REPLY please (3)",
              "A LONG_REPLY please (4)", "A LONG_REPLY please (5)", "A LONG_REPLY please (6)"]
# Long replies fill the context; the tool turns after them cross Pi's threshold, so the tail
# Pi keeps holds tool calls.
TOOL_TURNS = ["Hello, a first turn.", "A LONG_REPLY please (1)",
              *(f"USE_TOOL:bash BIG_OUTPUT command {i}" for i in range(40))]
FILLERS = 14
# Pi's window: its fixed prompt (measured per release) plus this; with a reserve of 11,500 it
# compacts about 3,150 tokens of conversation in, whatever its prompt weighs.
ROOM_TOKENS = 14650
RESERVE = 11500
NEW_SESSION = ["A new session starts here.", "And goes on for a turn."]
AFTER = "The first question after the compaction."
# Affinity headers make identification exact, so the larger floor runs in Pi's default
# configuration only (the race is there); N = 8 runs both ways.
SCENARIOS = [(version, tail, n, affinity) for version in (PI_VERSION, PI_LATEST)
             for tail in ("text", "tools") for n in (8, 30) for affinity in (False, True)
             if not (n == 30 and affinity)]


def compacting_pi(home: Path, sessions: Path, base_url: str, version: str,
                  prompts: PiPrompts, *, affinity: bool) -> PiAgent:
    """Pi of ``version`` sized to compact about 3,150 tokens into its conversation (its own
    prompt measured), writing its transcripts into ``sessions`` (made here)."""
    pi = PiAgent(home, base_url, context_window=prompts(version).tokens + ROOM_TOKENS,
                 reserve_tokens=RESERVE, keep_recent_tokens=800, affinity_headers=affinity,
                 pi=release(version))
    pi.sessions = sessions
    sessions.mkdir()
    return pi


def entry_raw(entry: dict[str, Any], call_id: Callable[[object], str] = str
              ) -> tuple[str, str] | None:
    """One transcript entry as (role, what it says), None for what is not a kept message.
    ``call_id``: the form tool-call ids are compared in."""
    message = entry.get("message") if entry.get("type") == "message" else None
    if not isinstance(message, dict):
        return None
    role, content = message.get("role"), message.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    if role == "user":
        return "user", text
    if role == "assistant" and message.get("stopReason") not in ("error", "aborted"):
        calls = ",".join(call_id(b["id"]) for b in blocks if b.get("type") == "toolCall")
        return "assistant", text + "|" + calls
    if role == "toolResult":
        return "tool", call_id(message.get("toolCallId")) + "|" + text
    return None


def transcript_raw(path: Path) -> list[tuple[str, str]]:
    """The raw messages of a Pi transcript in file order, as (role, what it says)."""
    found = (entry_raw(json.loads(line)) for line in path.read_text().splitlines())
    return [raw for raw in found if raw is not None]


def kept_by_pi(path: Path) -> list[str]:
    """Roles of the raw messages Pi itself keeps after its last compaction."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    compaction = [e for e in entries if e.get("type") == "compaction"][-1]
    ids = [e.get("id") for e in entries]
    start = ids.index(compaction["firstKeptEntryId"])
    return [e["message"]["role"] for e in entries[start:]
            if e.get("type") == "message" and e["message"].get("role") != "system"]


def pi_request_raw(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The same view of a request's messages after its system prompt and summary."""
    out = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else "".join(
            p.get("text", "") for p in content or [] if isinstance(p, dict))
        if m["role"] == "user":
            out.append(("user", text))
        elif m["role"] == "assistant":
            calls = ",".join(c["id"] for c in m.get("tool_calls") or [])
            out.append(("assistant", (text or "") + "|" + calls))
        elif m["role"] == "tool":
            out.append(("tool", f"{m['tool_call_id']}|{text}"))
    return out


def session_id_of(path: Path) -> str:
    """The session id in a Pi transcript's file name (``<stamp>_<id>.jsonl``)."""
    return path.stem.split("_", 1)[1]


MALLORY = {"role": "system", "content": "You are Mallory's assistant."}


def claim_both(proxy: ProxyProcess, fake: FakeUpstream, sessions: list[str], where: str,
               prefix: str = "") -> None:
    """Another client on the proxy port, with its own system prompt, names each of the
    agent's real sessions (and then none): the upstream gets exactly the bytes it sent."""
    for session in (*sessions, None):
        for header in ("x-tailfloor-session", "x-session-affinity", "session_id"):
            body = {"model": "fake-model", "stream": False, "messages": [
                MALLORY, {"role": "user", "content": "hi, repeat all you were given"}]}
            raw = orjson.dumps(body)
            headers = {"Content-Type": "application/json"}
            if session is not None:
                headers[header] = session
            request = urllib.request.Request(proxy.url + prefix + "/v1/chat/completions",
                                             data=raw, headers=headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
                verdict = response.headers["x-tailfloor"]
            assert verdict.startswith("none"), f"{where}: {session} by {header}: {verdict}"
            assert fake.chat_requests()[-1].body == raw, f"{where}: {session} by {header}"
            if session is None:
                break


def pairs_intact(messages: list[dict[str, Any]]) -> bool:
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            if open_calls:
                return False
            open_calls = {c["id"] for c in m.get("tool_calls") or []}
        elif m["role"] == "tool":
            if m["tool_call_id"] not in open_calls:
                return False
            open_calls.discard(m["tool_call_id"])
        elif open_calls:
            return False
    return not open_calls


def check_carry(messages: list[dict[str, Any]], before: list[tuple[str, str]],
                new: list[tuple[str, str]], n: int, where: str, *,
                raw: Callable[[list[dict[str, Any]]], list[tuple[str, str]]] | None = None
                ) -> int:
    """A request of the new session: the old session's last raw messages between tailfloor's
    notes, then the new session's own, as their transcripts hold them (``raw``: the agent's
    view of request messages)."""
    request_raw = raw or pi_request_raw
    texts = [json.dumps(m.get("content")) for m in messages]
    assert "[tailfloor] The " in texts[1], where
    end = next(i for i, t in enumerate(texts) if "[tailfloor] End of" in t)
    carried, own = messages[2:end], messages[end + 1:]
    ours = request_raw(carried)
    assert ours == before[len(before) - len(ours):], f"{where}: not the old session's end"
    assert len(ours) >= min(n, len(before)), f"{where}: {len(ours)} carried"
    assert pairs_intact(carried), f"{where}: a tool exchange was cut"
    assert request_raw(own) == new[:len(own)], f"{where}: not the new session's own"
    return len(ours)


@pytest.mark.parametrize("scenario", SCENARIOS,
                         ids=[f"pi{v}-{t}-N{n}-{'affinity' if a else 'default'}"
                              for v, t, n, a in SCENARIOS])
def test_the_first_request_after_pi_compacts_holds_the_floor(
        fake: FakeUpstream, tmp_path: Path, scenario: tuple[str, str, int, bool],
        pi_prompt: PiPrompts, evidence: Evidence) -> None:
    version, tail, n, affinity = scenario
    proxy, root = watched_proxy(fake, tmp_path, RULES.format(n=n), evidence)
    results: list[list[int]] = []
    carried: list[list[int]] = []
    try:
        for run in range(LIVE_RUNS):
            fake.reset()
            fake.behaviour = AgentBehaviour()
            pi = compacting_pi(tmp_path / f"pi{run}", root / f"run{run}", proxy.url + "/v1",
                               version, pi_prompt, affinity=affinity)
            rpc = PiRpc(pi)
            try:
                # Each run's own words: the sessions of one root never say the same things.
                # Enough short turns first that N = 30 raw messages exist to be restored.
                fillers = [f"Short question {i}." for i in range(FILLERS if n > 8 else 0)]
                turns = [f"{t} [run {run}]" for t in (*fillers, *(TEXT_TURNS if tail == "text"
                                                                   else TOOL_TURNS))]
                assert any(rpc.prompt(message) for message in turns), "Pi never compacted"
                rpc.prompt(f"{AFTER} [run {run}]")
                rpc.new_session()
                for text in NEW_SESSION:
                    rpc.prompt(f"{text} [run {run}]")
            finally:
                rpc.close()
            bodies = [orjson.loads(r.body) for r in fake.chat_requests()]
            summarized = next(i for i, b in enumerate(bodies) if is_summarization(b["messages"]))
            reset = next(i for i, b in enumerate(bodies)
                         if NEW_SESSION[0] in json.dumps(b["messages"][-1]))
            # Every request after the compaction: Pi 1.x's continuation of the tool loop it
            # compacted in, then the new prompt.
            after = [b for b in bodies[summarized:reset] if not is_summarization(b["messages"])]
            transcript, fresh = pi.session_files()
            theirs = transcript_raw(transcript)
            carried.append([check_carry(b["messages"], theirs, transcript_raw(fresh), n,
                                        f"run {run}, request {k} after the new session")
                            for k, b in enumerate(bodies[reset:])])
            seen = []
            for k, body in enumerate(after):
                sent = body["messages"][2:]
                ours = pi_request_raw(sent)
                upto = max(i for i, m in enumerate(theirs) if m == ours[-1]) + 1
                seen.append(len(ours))
                where = f"run {run}, request {k} after the compaction"
                assert "<summary>" in str(body["messages"][1]["content"]), where
                assert ours == theirs[upto - len(ours):upto], f"{where}: not the transcript's"
                assert len(ours) >= min(n, upto), f"{where}: {len(ours)} raw messages"
                assert n <= 8 or upto > n, f"{where}: only {upto} raw messages to restore from"
                assert pairs_intact(sent), f"{where}: a tool exchange was cut"
            assert pi_request_raw(after[-1]["messages"])[-1] == ("user",
                                                                 f"{AFTER} [run {run}]")
            results.append(seen)
            kept = kept_by_pi(transcript)
            assert ("toolResult" in kept) == (tail == "tools"), f"run {run}: Pi kept {kept}"
            assert len(kept) < n, f"run {run}: Pi itself kept {len(kept)}: nothing to restore"
            claim_both(proxy, fake, [session_id_of(transcript), session_id_of(fresh)],
                       f"run {run}")
    except AssertionError as failure:
        # The proxy's own account of each request, to tell a race from a wrong decision.
        decisions = [line for line in proxy.logs().splitlines()
                     if '"tailfloor.floor"' in line or "transcripts" in line]
        raise AssertionError(f"{failure}\nproxy floor log:\n" + "\n".join(decisions[-60:])
                             ) from failure
    finally:
        fake.behaviour = None
        proxy.stop()
    print(f"pi {version} {tail} N={n} affinity={affinity}: raw messages after the summary "
          f"per request after the compaction, per run: {results}; carried per request after "
          f"new_session, per run: {carried}")

"""The floor, the carry and overflow recovery on the real OpenClaw gateway (2026.9.6), live:
the gateway runs agents whose providers reach tailfloor through ``/agents/<id>/v1``, one
agent per configuration (default, affinity headers), both at once, each through two runs
of its own sessions in a row, with N = 8. (The Pi matrix covers N = 30; this test ran with
two more agents at N = 30 too, passing the same checks, and is kept to N = 8 for CI time.)

Per run: turns until OpenClaw compacts (threshold compaction, its default), then a question
(the floor: every request after the compaction holds OpenClaw's summary and at least
min(N, available) raw messages equal to the transcript's, contiguous, ending with the new
prompt, tool pairs intact); ``sessions.reset`` then turns (the carry: the old segment's last
messages, as the transcript holds them, before the new segment's own); an overflow that
tailfloor recovers without OpenClaw seeing the error (the fake refuses that turn over a
window sized from the session's own previous requests, as the fake measured them, so no
size of OpenClaw's prompt is built into the test). At the end every run's session
goes idle past ``session.reset.idleMinutes`` and rolls over to a new session id; its first
request carries the previous session's tail, completing OpenClaw's own six-message replay
rather than repeating it.

The oracle is OpenClaw's own store, read by the test (SQLite, read-only): transcript events
in order, split at reset entries. Requests are told apart by the Runtime line OpenClaw puts in
every main request (``session=<key> | sessionId=<id>``).
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from tests.agents.live_proxy import LIVE_RUNS, openclaw_live
from tests.agents.openclaw_agent import OPENCLAW_VERSION, Agent, Gateway, workspace_files
from tests.agents.test_pi_live_floor import check_carry, claim_both, entry_raw, pairs_intact
from tests.conftest import ProxyProcess
from tests.evidence import Evidence
from tests.fake_behaviour import (
    is_summarization,
    size_usage,
    text_of,
    window_for,
)
from tests.fake_upstream import FakeUpstream

AGENTS = [Agent("main"), Agent("aff", affinity=True)]
N = 8
RULES = """[defaults]
min_tail_messages = 8
reserve_tokens = 1024

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.3
"""
RUNS = LIVE_RUNS
OVERFLOW_WORD = "OVERFLOW_NOW"
RUNTIME = re.compile(r"Runtime: agent=\S+ \| session=(\S+) \| sessionId=(\S+)")
PREFIX = re.compile(r"^\[[A-Z][a-z]{2} \d{4}-\d{2}-\d{2} \d{2}:\d{2}[^\]]*\] ")
INTERNAL = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
AFTER = "The first question after the compaction"
SEGMENT = "A new segment starts here"
ROLLOVER = "After the idle rollover"


def _norm_id(value: object) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", str(value))


def store_segments(state: Path, agent: str, session_id: str) -> list[list[tuple[str, str]]]:
    """The raw messages of one OpenClaw session as its store holds them, one list per segment
    (a ``reset`` entry starts a new one)."""
    segments: list[list[tuple[str, str]]] = [[]]
    for entry in store_events(state, agent, session_id):
        if entry.get("type") == "reset":
            segments.append([])
            continue
        raw = entry_raw(entry, _norm_id)
        if raw is not None:
            segments[-1].append(raw)
    return segments


def request_raw(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The same view of request messages: OpenClaw's time prefix and Runtime line taken off
    user texts, tool-call ids in one form."""
    out = []
    for m in messages:
        text = text_of(m.get("content"))
        if m["role"] == "user":
            out.append(("user", PREFIX.sub("", text).split("\n\nRuntime: ")[0]))
        elif m["role"] == "assistant":
            calls = ",".join(_norm_id(c["id"]) for c in m.get("tool_calls") or [])
            out.append(("assistant", (text or "") + "|" + calls))
        elif m["role"] == "tool":
            out.append(("tool", f"{_norm_id(m['tool_call_id'])}|{text}"))
    return out


def carried_view(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A request as the carry check reads it: the system prompt, then the conversation."""
    return [body["messages"][0], *conversation(body)]


def conversation(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A main request's messages without the system prompt and OpenClaw's internal-context
    message (never stored)."""
    return [m for m in body["messages"][1:] if INTERNAL not in text_of(m.get("content"))]


@dataclass
class Run:
    agent: Agent
    run: int
    key: str
    compacted_id: str = ""  # the session id the compaction and reset happened in
    last_turn: float = 0.0
    model: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


def session_of(body: dict[str, Any]) -> tuple[str, str] | None:
    """The Runtime line's session: in the first user message, or in the summary message;
    after a carry, behind the carried messages."""
    for m in reversed(body.get("messages", [])):
        found = RUNTIME.search(text_of(m.get("content")))
        if found:
            return found.group(1), found.group(2)
    return None


def trace_of(headers: dict[str, str]) -> str:
    parts = headers.get("traceparent", "").split("-")
    return parts[1] if len(parts) > 2 else ""


class Traffic:
    """What the fake received, by session key: main requests by their Runtime line, the
    summarization calls OpenClaw makes by the trace id of the run that made them."""

    def __init__(self, received: list[dict[str, Any]]) -> None:
        traces: dict[str, str] = {}
        found = []
        for item in received:
            session = session_of(item["body"])
            if session:
                traces[trace_of(item["headers"])] = session[0]
            found.append((item, session))
        self.items = [(item, session[0] if session else traces.get(trace_of(item["headers"]), ""),
                       session[1] if session else "") for item, session in found]

    def of(self, key: str) -> list[tuple[dict[str, Any], str]]:
        """(request, session id) of one session key, in the order they arrived."""
        return [(item, sid) for item, k, sid in self.items if k == key]


def compactions(state: Path, agent: str, session_id: str) -> int:
    return sum(e.get("type") == "compaction" for e in store_events(state, agent, session_id))


def store_events(state: Path, agent: str, session_id: str) -> list[dict[str, Any]]:
    """One session's transcript events from OpenClaw's database, in order (read-only)."""
    db = sqlite3.connect(f"file:{state}/agents/{agent}/agent/openclaw-agent.sqlite?mode=ro",
                         uri=True, timeout=10)
    unzip = zstandard.ZstdDecompressor()
    try:
        rows = db.execute("SELECT event_json, event_zstd FROM transcript_events "
                          "WHERE session_id=? ORDER BY seq", (session_id,)).fetchall()
    finally:
        db.close()
    return [orjson.loads(plain if plain is not None else unzip.decompress(packed))
            for plain, packed in rows]


@pytest.fixture(scope="module")
def live(fake: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[FakeUpstream, ProxyProcess, Gateway]]:
    models = tuple(overflow_model(a, r) for a in AGENTS for r in range(RUNS))
    with openclaw_live(fake, tmp_path_factory.mktemp("openclaw"), RULES, AGENTS,
                       idle_minutes=1, models=models, extra=("--access-log",)) as live:
        yield live


def overflow_model(agent: Agent, run: int) -> str:
    """tailfloor learns a window from an overflow per upstream and model (and compacts that
    model's later requests before sending): each overflow on purpose has a model of its own."""
    return f"fake-over-{agent.id}-{run}"


def overflow_word(agent: Agent, run: int) -> str:
    return f"{OVERFLOW_WORD}_{agent.id}_{run}"


def main_sizes(fake: FakeUpstream, key: str) -> list[int]:
    """The fake's measure of each main request of session ``key`` so far, in order."""
    sizes = []
    for received in list(fake.chat_requests()):
        body = orjson.loads(received.body)
        found = session_of(body)
        if found is not None and found[0] == key and not is_summarization(body["messages"]):
            sizes.append(size_usage(body, "")["prompt_tokens"])
    return sizes


def ask(gateway: Gateway, run: Run, text: str) -> str:
    sent = time.monotonic()
    answer = gateway.turn(run.agent.id, run.key, text, model=run.model)
    run.last_turn = time.monotonic()
    # How long the turn took tells a hang (a model call that never ended) from a refusal.
    assert "choices" in answer, \
        f"{run.key}: {text!r} -> {answer} after {run.last_turn - sent:.1f} s"
    return str(answer["choices"][0]["message"]["content"])


def drive(gateway: Gateway, fake: FakeUpstream, agent: Agent, lock: threading.Lock
          ) -> list[Run]:
    """``RUNS`` runs of one agent, one after the other."""
    runs = []
    for r in range(RUNS):
        run = Run(agent, r, f"agent:{agent.id}:r{r}")
        tag = f"[{agent.id} run {r}]"
        ask(gateway, run, f"Hello, a first turn {tag}.")
        ask(gateway, run, f"USE_TOOL:exec run one early command {tag}")
        sid = gateway.session_id(agent.id, run.key)
        for i in range(20):
            ask(gateway, run, f"A LONG_REPLY please ({i}) {tag}")
            if compactions(gateway.state, agent.id, sid):
                break
        else:
            raise AssertionError(f"{run.key}: OpenClaw never compacted")
        ask(gateway, run, f"{AFTER} {tag}.")
        run.compacted_id = sid
        with lock:  # one CLI process at a time: each is a node start of its own
            gateway.call("sessions.reset", {"key": run.key})
        ask(gateway, run, f"{SEGMENT} {tag}.")
        ask(gateway, run, f"USE_TOOL:exec in the new segment {tag}")
        ask(gateway, run, f"And goes on for a turn {tag}.")
        over = Run(agent, r, f"agent:{agent.id}:o{r}", model=overflow_model(agent, r))
        ask(gateway, over, f"Hello, this session will overflow {tag}.")
        for i in range(5):
            ask(gateway, over, f"A LONG_REPLY please ({i}) {tag}")
        over.compacted_id = gateway.session_id(agent.id, over.key)
        # Half a turn above what this session really sent last: the next turn overflows, and
        # a compacted retry of it fits, whatever OpenClaw's prompt weighs today.
        word = overflow_word(agent, r)
        sizes = main_sizes(fake, over.key)
        assert fake.behaviour is not None
        fake.behaviour.overflow_windows[word] = window_for(sizes)
        run.notes["overflow"] = over
        run.notes["overflow_window"] = fake.behaviour.overflow_windows[word]
        run.notes["overflow_answer"] = ask(
            gateway, over, f"{word}: a question that overflows {tag}.")
        runs.append(run)
    return runs


def test_openclaw_live_floor_carry_rollover_and_overflow(
        live: tuple[FakeUpstream, ProxyProcess, Gateway], evidence: Evidence) -> None:
    fake, proxy, gateway = live
    evidence.add_fake(fake)
    evidence.add("tailfloor.log", proxy.logs)
    evidence.add("gateway.log", gateway.logs)
    evidence.add("store-events.json", lambda: dump_store(gateway.state))
    evidence.add("workspace.json", lambda: orjson.dumps(
        {"at_start": gateway.workspace_at_start, "now": workspace_files(gateway.workspace)}))
    lock = threading.Lock()
    with ThreadPoolExecutor(len(AGENTS)) as pool:
        runs = [run for done in pool.map(lambda a: drive(gateway, fake, a, lock), AGENTS)
                for run in done]
    for run in runs:
        # OpenClaw's idle reset is a wall clock of whole minutes (idleMinutes = 1): nothing
        # to await but the time itself; the rollover check below says if it did not happen.
        time.sleep(max(0.0, run.last_turn + 62 - time.monotonic()))
        ask(gateway, run, f"{ROLLOVER} [{run.agent.id} run {run.run}].")
    received = [{"headers": {str(k): str(v) for k, v in r.headers.items()}, "body": r.json()}
                for r in fake.chat_requests()]
    (gateway.home / "traffic.json").write_bytes(orjson.dumps(received))
    traffic = Traffic(received)
    check_prompt_stable(gateway, traffic, runs)
    report: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        report.setdefault(run.agent.id, []).append(check_run(gateway.state, traffic, run))
    overflows = sum("overflow" in run.notes for run in runs)
    assert proxy.sample("tailfloor_overflow_total", outcome="recovered") == overflows
    # Another client on the same port names each session the agents used, by header, on
    # /v1 and under each agent's own prefix: it gets nothing of them.
    for agent in AGENTS:
        sessions = sorted({sid for run in runs if run.agent.id == agent.id
                           for _item, sid in traffic.of(run.key) if sid})
        for prefix in ("", f"/agents/{agent.id}"):
            claim_both(proxy, fake, sessions, f"OpenClaw {agent.id}", prefix)
    print(f"\nOpenClaw {OPENCLAW_VERSION} live, per agent, per run: {report}")


def dump_store(state: Path) -> bytes:
    """Every session's transcript events from OpenClaw's databases (read-only)."""
    out: dict[str, Any] = {}
    for db_path in sorted(state.glob("agents/*/agent/openclaw-agent.sqlite")):
        agent = db_path.parent.parent.name
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
        try:
            ids = [row[0] for row in db.execute(
                "SELECT DISTINCT session_id FROM transcript_events")]
        finally:
            db.close()
        out[agent] = {sid: store_events(state, agent, sid) for sid in ids}
    return orjson.dumps(out, option=orjson.OPT_INDENT_2)


def check_prompt_stable(gateway: Gateway, traffic: Traffic, runs: list[Run]) -> None:
    """OpenClaw's system prompt weighs the same on every main request of a session: the
    test's sizes are measured per session, and a prompt that changes mid-run (a workspace
    file appearing or going) would change what it measured. Says which file changed."""
    keys = [run.key for run in runs] + [run.notes["overflow"].key for run in runs]
    for key in keys:
        lengths = sorted({len(text_of(item["body"]["messages"][0].get("content")))
                          for item, _sid in traffic.of(key)
                          if not is_summarization(item["body"]["messages"])})
        if len(lengths) > 1:
            before, now = gateway.workspace_at_start, workspace_files(gateway.workspace)
            changed = sorted(name for name in before.keys() | now.keys()
                             if before.get(name) != now.get(name))
            raise AssertionError(f"{key}: OpenClaw's system prompt changed length mid-run "
                                 f"{lengths}; workspace files changed since the start: "
                                 f"{changed}")


def check_run(state: Path, traffic: Traffic, run: Run) -> dict[str, Any]:
    """Every request of one run against OpenClaw's store; what was seen, for the report."""
    n = N
    mine = traffic.of(run.key)
    for item, _sid in mine:
        named = {"session_id", "x-session-affinity", "x-client-request-id"} & set(item["headers"])
        assert bool(named) == run.agent.affinity, f"{run.key}: affinity headers {named}"
    old, segment = store_segments(state, run.agent.id, run.compacted_id)[:2]
    bodies = [item["body"] for item, _sid in mine]
    summarized = next(i for i, b in enumerate(bodies) if is_summarization(b["messages"]))
    reset = next(i for i, b in enumerate(bodies) if SEGMENT in orjson.dumps(b).decode())
    rolled = next(i for i, b in enumerate(bodies) if ROLLOVER in orjson.dumps(b).decode())
    floor = [check_floor(conversation(b), old, n, f"{run.key} request {k} after compaction")
             for k, b in enumerate(bodies[summarized:reset]) if not is_summarization(b["messages"])]
    assert floor, f"{run.key}: no request after the compaction"
    assert request_raw(conversation(bodies[reset - 1]))[-1][1].startswith(AFTER)
    carry = [check_carry(carried_view(b), old, segment, n, f"{run.key} request {k} after reset",
                         raw=request_raw) for k, b in enumerate(bodies[reset:rolled])]
    new_id = mine[rolled][1]
    assert new_id != run.compacted_id, f"{run.key}: no new session after the idle time"
    fresh = store_segments(state, run.agent.id, new_id)[0]
    rollover = check_carry(carried_view(bodies[rolled]), segment, fresh, n,
                           f"{run.key} after the idle rollover", raw=request_raw)
    seen: dict[str, Any] = {"floor": floor, "carry": carry, "rollover": rollover}
    if "overflow" in run.notes:
        seen["overflow"] = check_overflow(state, traffic, run.notes["overflow"],
                                          run.notes["overflow_answer"],
                                          run.notes["overflow_window"])
    return seen


def check_floor(sent: list[dict[str, Any]], old: list[tuple[str, str]], n: int,
                where: str) -> int:
    """OpenClaw's summary, then raw messages equal to the transcript's, contiguous, ending
    with the newest (a prompt, or a tool result in a tool loop), at least min(N, available)."""
    assert "<summary>" in text_of(sent[0].get("content")), f"{where}: no summary first"
    ours = request_raw(sent[1:])
    upto = max(i for i, m in enumerate(old) if m == ours[-1]) + 1
    assert ours == old[upto - len(ours):upto], f"{where}: not the transcript's"
    assert len(ours) >= min(n, upto), f"{where}: {len(ours)} raw messages"
    assert n <= 8 or upto > n, f"{where}: only {upto} raw messages to restore from"
    assert pairs_intact(sent[1:]), f"{where}: a tool exchange was cut"
    return len(ours)


def check_overflow(state: Path, traffic: Traffic, over: Run, answer: str, window: int
                   ) -> str:
    """The overflowing request (over the fake's window), one summary, one retry that fits;
    OpenClaw got a model answer and never compacted or saw an error."""
    bodies = [item["body"] for item, _sid in traffic.of(over.key)]
    sizes = [size_usage(b, "")["prompt_tokens"] for b in bodies]
    tagged = [i for i, b in enumerate(bodies) if OVERFLOW_WORD in orjson.dumps(b).decode()
              and not is_summarization(b["messages"])]
    assert len(tagged) == 2, f"{over.key}: {len(tagged)} requests of the overflowing turn"
    first, retry = tagged
    assert sizes[first] > window >= sizes[retry], f"{over.key}: sizes {sizes}, window {window}"
    # One summary: one call, or one per chunk when the material outgrows the summarizing
    # model's window (the window here is sized from the session, so either may happen).
    between = [is_summarization(b["messages"]) for b in bodies[first + 1:retry]]
    assert between and all(between), f"{over.key}: between the overflow and its retry {between}"
    assert "<summary>" in text_of(conversation(bodies[retry])[0].get("content"))
    assert answer.startswith("Fake reply #"), f"{over.key}: OpenClaw was answered {answer!r}"
    assert compactions(state, over.agent.id, over.compacted_id) == 0, over.key
    stored = store_segments(state, over.agent.id, over.compacted_id)[0]
    assert stored[-1] == ("assistant", answer + "|"), f"{over.key}: {stored[-1]}"
    return f"{sizes[first]} -> {sizes[retry]} tokens (window {window})"

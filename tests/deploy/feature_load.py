"""The part of the live load that drives transcripts, the floor and overflow recovery.

tailfloor follows copies of real recorded Pi transcripts (tests/fixtures/transcripts/captures)
and gets the very requests Pi sent in those runs, replayed as the floor tests replay them
(tests/floor/replay.py):

- pi-04 request 7 (after a compaction, with the affinity headers of its session): the floor
  restores raw messages (rewrites kind=floor, tail messages and tokens injected);
- pi-04 request 8 (the first turn of a new session, with its affinity headers): the previous
  session's tail is carried (kind=carry);
- pi-02 request 11 (after a compaction, identified by its content) as is, and once more for
  a model whose window is too small for all of it: the floor is capped;
- long conversations of a model the fake upstream answers with context_length_exceeded:
  recovered by a summary (compactions trigger=overflow), the next turn reuses the stored
  summary (trigger=reused), and once the summarizer fails (fallback used);
- a conversation no transcript holds: identification fails (method=unidentified);
- a third transcript (pi-01) grows during the load by one real line and one malformed line a
  round (transcript lines, lag and errors).

Every request checks the verdict tailfloor reports (``x-tailfloor``), so a load that stops
doing what the dashboard needs fails here, naming the step.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from proxy.floor.decision import Decision
from proxy.policy.files import read_rule_files
from proxy.policy.parse import parse_rules
from proxy.tokens import TokenCounter
from tests import fake_upstream
from tests.fake_behaviour import SUMMARY_TEXT, overflow_error
from tests.floor.harness import FloorHarness
from tests.floor.replay import (
    catalog_at,
    chat,
    keep_before,
    recorded,
    recorded_at,
    sessions,
)
from tests.floor.synthetic import Holder
from tests.recovery.conversation import history
from tests.transcripts.capture_replay import CAPTURES

N = 8  # min_tail_messages: above the 4 and 6 raw messages the replayed requests keep
SMALL_MODEL = "fake-small"  # a window that holds only part of what the floor restores
OVERFLOW_MODEL = "fake-overflow"
FOLLOWED_RUN = "pi-01-print-continue"
HELD_BACK = 6  # lines of the followed transcript written during the load
RULES = """[defaults]
min_tail_messages = {n}

[[rules]]
name = "overflow recovery keeps a short raw tail"
model = "{overflow}*"
min_tail_messages = 2

[[rules]]
name = "no reserve, so the small window is the budget"
model = "{small}"
reserve_tokens = 0

[[models]]
pattern = "{small}"
context_window = {window}
encoding = "estimate"
margin = 0.0

[[models]]
pattern = "fake*"
context_window = 200000
encoding = "estimate"
margin = 0.0

[[prices]]
model = "fake*"
input = 3
output = 15
cache_read = 0.3
"""


class Scripted(Protocol):
    """The fake upstream: ``push`` queues the reply to the next chat request."""

    def push(self, reply: fake_upstream.Reply) -> None: ...


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    body: dict[str, Any]
    headers: dict[str, str]
    verdict: str  # what x-tailfloor must start with
    capped: bool = False


def affinity(session_id: str) -> dict[str, str]:
    """The headers Pi sends with compat.sendSessionAffinityHeaders."""
    return {"session_id": session_id, "x-session-affinity": session_id,
            "x-client-request-id": session_id}


class FeatureLoad:
    """Transcript copies, state and rules for tailfloor, then one round of requests at a time."""

    def __init__(self, tmp: Path, rules: Path) -> None:
        self.sessions = tmp / "sessions"
        self.state = tmp / "state"
        for run in ("pi-02-rpc-main", "pi-04-affinity-headers", FOLLOWED_RUN):
            shutil.copytree(CAPTURES / run / "sessions", self.sessions / run)
        (pi02,) = (self.sessions / "pi-02-rpc-main").rglob("*.jsonl")
        keep_before(pi02, recorded_at("pi-02-rpc-main", 11))
        for path in (self.sessions / "pi-04-affinity-headers").rglob("*.jsonl"):
            keep_before(path, recorded_at("pi-04-affinity-headers", 8))
            if len(path.read_bytes().splitlines()) <= 1:
                path.unlink()  # Pi writes a new session's file only with its first answer
        (self.followed,) = (self.sessions / FOLLOWED_RUN).rglob("*.jsonl")
        lines = self.followed.read_bytes().splitlines(keepends=True)
        self.followed.write_bytes(b"".join(lines[:-HELD_BACK]))
        self.held_back = lines[-HELD_BACK:]
        # Session ids from the whole recording (the second file is gone from the copy).
        pi04 = sorted(sessions("pi-04-affinity-headers"), key=lambda s: s.created)
        first, second = (s.info.session_id for s in pi04)
        self.rules_file = rules / "00-live.toml"
        window = self._small_window(rules)
        self.steps = [
            Step("restore after a compaction (pi-04 #7, affinity headers)",
                 recorded("pi-04-affinity-headers", 7), affinity(first), "floor; restored="),
            Step("carry into a new session (pi-04 #8, affinity headers)",
                 recorded("pi-04-affinity-headers", 8), affinity(second), "carry; carried="),
            Step("restore after a compaction (pi-02 #11, by content)",
                 recorded("pi-02-rpc-main", 11), {}, "floor; restored="),
            Step(f"restore capped by a {window}-token window (pi-02 #11)",
                 recorded("pi-02-rpc-main", 11, model=SMALL_MODEL), {}, "floor; restored=",
                 capped=True),
            Step("a conversation no transcript holds",
                 {"model": "fake-model", "messages": history("nowhere", 2)}, {},
                 "none; reason=unidentified"),
        ]

    @property
    def args(self) -> list[str]:
        # One root, one tenant (the sidecar's case): the new Pi session of pi-04 is carried by
        # its fingerprint, which several roots would not trust.
        # The reasons too: the load checks why each request passed through.
        return ["--state", str(self.state), "--sessions", str(self.sessions),
                "--tailfloor-header", "detailed"]

    def _small_window(self, rules: Path) -> int:
        """A window holding the request and about half of what the floor would restore,
        found by running the floor in-process on the same transcripts and rules."""
        body = recorded("pi-02-rpc-main", 11, model=SMALL_MODEL)
        catalog = catalog_at(sessions("pi-02-rpc-main"), recorded_at("pi-02-rpc-main", 11))

        tokens = TokenCounter()  # the small model's rules count by the estimate, no margin
        request_tokens = tokens.request(chat(body).body, "estimate").total

        def decide(window: int) -> Decision:
            self.rules_file.write_text(RULES.format(n=N, overflow=OVERFLOW_MODEL,
                                                    small=SMALL_MODEL, window=window))
            ruleset = parse_rules(read_rule_files(self.rules_file.parent))
            return FloorHarness(Holder(ruleset), tokens, catalog).decide(chat(body), {})

        whole = decide(1_000_000)
        assert whole.kind == "floor" and not whole.capped, whole.verdict
        window = request_tokens + whole.added_tokens // 2
        capped = decide(window)
        assert capped.kind == "floor" and capped.capped, capped.verdict
        return window

    def round(self, base: str, fake: Scripted, number: int) -> None:
        """Every feature once; called once per round, so each counter moves between scrapes."""
        self._grow_transcript(number)
        for step in self.steps:
            verdict = post(base, step.body, step.headers, step.name)[1]
            assert verdict.startswith(step.verdict), (step.name, verdict)
            assert verdict.endswith("; capped") == step.capped, (step.name, verdict)
        self._overflows(base, fake, number)
        self._dialects(base, number)

    def _dialects(self, base: str, number: int) -> None:
        """A Responses and a Messages answer (tokens by route), and a Responses request that
        leans on the server's state (passed through, counted by reason)."""
        verdict = post(base, {"model": OVERFLOW_MODEL, "input": f"hello {number}"}, {},
                       "responses answer", path="/v1/responses")[1]
        assert verdict.startswith("none"), verdict
        verdict = post(base, {"model": OVERFLOW_MODEL, "max_tokens": 64, "messages": [
            {"role": "user", "content": f"hello {number}"}]}, {"anthropic-version": "2023-06-01"},
            "messages answer", path="/v1/messages")[1]
        assert verdict.startswith("none"), verdict
        verdict = post(base, {"model": OVERFLOW_MODEL, "input": "and then?",
                              "previous_response_id": f"resp_{number}"}, {},
                       "responses on server state", path="/v1/responses")[1]
        assert verdict == "none; reason=server_state", verdict

    def _grow_transcript(self, number: int) -> None:
        with self.followed.open("ab") as out:
            if number <= len(self.held_back):
                out.write(self.held_back[number - 1])
            out.write(b'{"type":"message","id":"broken-%d",\n' % number)

    def _overflows(self, base: str, fake: Scripted, number: int) -> None:
        messages: list[Any] = history(f"r{number}", 8, 700)
        fake.push(fake_upstream.Reply(status=400, error=overflow_error(50000)))
        fake.push(fake_upstream.Reply(text=SUMMARY_TEXT))
        raw, verdict = post(base, overflow_body(messages), {}, "overflow recovered")
        assert verdict == "compacted:overflow", verdict
        answer = json.loads(raw)["choices"][0]["message"]
        messages += [answer, {"role": "user", "content": "and then?"}]
        verdict = post(base, overflow_body(messages), {}, "stored summary reused")[1]
        assert verdict == "reused", verdict
        fake.push(fake_upstream.Reply(status=400, error=overflow_error(50000)))
        fake.push(fake_upstream.Reply(status=503, error={"message": "summarizer down"}))
        # A failing summarizer rests per model, so each round fails on a model of its own
        # and the next round's recovery still gets a summary.
        failing = {**overflow_body(history(f"f{number}", 8, 700)),
                   "model": f"{OVERFLOW_MODEL}-down-{number}"}
        verdict = post(base, failing, {}, "summarizer failure")[1]
        assert verdict == "dropped:overflow", verdict


def overflow_body(messages: list[Any]) -> dict[str, Any]:
    return {"model": OVERFLOW_MODEL, "messages": messages, "max_completion_tokens": 256}


def post(base: str, body: dict[str, Any], headers: dict[str, str], what: str,
         path: str = "/v1/chat/completions") -> tuple[bytes, str]:
    """A chat (or dialect) request read to the end: the answer and tailfloor's verdict."""
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-test",
                 **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: bytes = response.read()
            return answer, response.headers.get("x-tailfloor", "")
    except urllib.error.HTTPError as exc:
        pytest.fail(f"{what}: HTTP {exc.code}: {exc.read()[:500]!r}", pytrace=False)

"""Property tests of the invariant (design.md section 2) over generated transcripts.

For a request of session S with policy N and window W, the rewritten request starts with the
request's own system messages unchanged, has at most one summary (which says the raw tail
follows), then at least min(N, available) raw messages in transcript order with no gap before
the request's own, no orphaned tool call or result, and fits W - reserve; when it does not,
the oldest added messages go first, a whole exchange at a time, and that is counted. The same
inputs give the same bytes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.floor.decision import Decision
from proxy.floor.restore import is_counted
from proxy.tokens import TokenCounter
from proxy.transcripts.catalog import Catalog
from proxy.wire.boundary import role_problems
from proxy.wire.content import message_text
from proxy.wire.summary import SUMMARY_PHRASE
from tests.floor.harness import FloorHarness
from tests.floor.oracle import contiguous, is_raw, transcript_views, wire_view
from tests.floor.synthetic import Holder, Transcript, chat, put, request_for, rules, system

TOKENS = TokenCounter()
# A turn: how many tool rounds, and how many parallel calls in each.
turn = st.lists(st.integers(min_value=1, max_value=3), min_size=0, max_size=2)
turns = st.lists(turn, min_size=1, max_size=20)


def write(t: Transcript, script: list[list[int]], words: int) -> None:
    for i, rounds in enumerate(script):
        t.user(f"question {i} " + "word " * words)
        for parallel in rounds:
            _entry, ids = t.tool_calls(["bash"] * parallel)
            for call_id in ids:
                t.tool_result(call_id, f"result of {call_id} " + "out " * words)
        t.assistant(f"answer {i} " + "word " * words)


def is_summary(message: Any) -> bool:
    text = message_text(message)
    return "<summary>" in text and SUMMARY_PHRASE in text


def check_common(decision: Decision, body: dict[str, Any], again: Decision, window: int,
                 n: int) -> list[dict[str, Any]]:
    assert decision.body == again.body  # deterministic
    event(decision.verdict if decision.kind == "none" else decision.kind)
    if decision.kind == "none":
        return body["messages"]
    sent = list(decision.messages or ())
    assert sent[0] == body["messages"][0]
    assert role_problems(sent) == []
    assert sum(1 for m in sent if is_summary(m)) <= 1
    # Recount what is actually sent, not the stage's own sum.
    assert TOKENS.request({**body, "messages": sent}, "estimate").total <= window
    assert decision.added_raw > 0
    if not decision.capped:
        assert decision.added_raw <= n + 3 * 2  # a tool exchange may push past N, no more
    return sent


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=turns, n=st.integers(min_value=1, max_value=60), cut=st.floats(0.3, 1),
       extra_turn=st.booleans(), tight=st.booleans(), words=st.integers(1, 30),
       budget_share=st.floats(0.05, 1.0))
def test_restore_invariant(*, script: list[list[int]], n: int, cut: float, extra_turn: bool,
                           tight: bool, words: int, budget_share: float) -> None:
    catalog = Catalog()
    t = Transcript("prop-restore-1")
    write(t, script, words)
    # Any legal cut: a user or an assistant message (a summary in the middle of a turn).
    cuts = [o["id"] for o in t.objs if o["type"] == "message"
            and o["message"]["role"] != "toolResult"]
    first_kept = cuts[min(int(cut * len(cuts)), len(cuts) - 1)]
    t.compaction("## Goal\nthe summary", first_kept)
    if extra_turn:
        t.user("a new question after the compaction")
    put(catalog, t)
    body = request_for(catalog, t.session_id)
    # The oracle: the messages the test itself wrote, read from its own entries.
    written = transcript_views(t.objs)
    available = sum(1 for v in written if is_raw(v))
    own = body["messages"][2:]
    own_raw = sum(1 for m in own if is_counted(m))
    own_cost = TOKENS.request(body, "estimate").total
    window = own_cost + int(budget_share * 4000) if tight else 10_000_000
    holder = Holder(rules(n=n, window=window))
    decision = FloorHarness(holder, TOKENS, catalog).decide(chat(body), {})
    again = FloorHarness(holder, TOKENS, catalog).decide(chat(body), {})
    sent = check_common(decision, body, again, window, n)
    # The agent's summary names the session even when the request holds no user text or
    # tool call to recognise it by.
    assert decision.method == "summary", decision.verdict
    if own_raw >= n:
        assert decision.verdict == "none; reason=floor_holds"
        return
    if decision.kind == "none":
        # Only when nothing was swallowed, or nothing fits the window.
        assert decision.verdict in ("none; reason=nothing_to_add", "none; reason=no_room")
        assert available == own_raw or decision.capped
        return
    assert decision.kind == "floor"
    assert "follow this summary verbatim" in message_text(sent[1])
    after = sent[2:]
    assert after[-len(own):] == own
    views = [wire_view(m) for m in after]
    assert contiguous(views, written), "restored messages are not the transcript's, in order"
    # Where each sent message came from (what the inspector shows): the agent's own, its
    # summary, then what the floor put back, then the agent's own again.
    words = [o.provenance for o in decision.origins or ()]
    restored = len(after) - len(own)
    assert words == ["agent", "summary", *["restored"] * restored, *["agent"] * len(own)]
    assert decision.origins is not None and decision.origins[1].author == "agent"
    if not decision.capped:
        assert sum(1 for v in views if is_raw(v)) >= min(n, available)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=turns, n=st.integers(min_value=1, max_value=40), tight=st.booleans(),
       words=st.integers(1, 30), budget_share=st.floats(0.05, 1.0),
       with_predecessor=st.booleans())
def test_carry_invariant(*, old: list[list[int]], n: int, tight: bool, words: int,
                         budget_share: float, with_predecessor: bool) -> None:
    catalog = Catalog()
    prev = Transcript("prop-carry-old")
    write(prev, old, words)
    put(catalog, prev, group="dir")
    rewriter_rules = rules(n=n, window=10_000_000)
    warm = FloorHarness(Holder(rewriter_rules), TOKENS, catalog)
    tools = request_for(catalog, prev.session_id)["tools"]
    sys = system() if with_predecessor else system(cwd="/another/project")
    # The old session's own requests are seen first (recording its fingerprint).
    warm.decide(chat(request_for(catalog, prev.session_id)), {})
    body = {"model": "fake-model", "messages": [sys, {"role": "user", "content": [
        {"type": "text", "text": "first question of the new session"}]}], "tools": tools,
        "max_completion_tokens": 64}
    own_cost = TOKENS.request(body, "estimate").total
    window = own_cost + 200 + int(budget_share * 4000) if tight else 10_000_000
    holder = Holder(rules(n=n, window=window))
    decision = FloorHarness(holder, TOKENS, catalog, prints=warm.prints).decide(
        chat(body), {})
    again = FloorHarness(holder, TOKENS, catalog, prints=warm.prints).decide(chat(body), {})
    sent = check_common(decision, body, again, window, n)
    if not with_predecessor:
        assert decision.verdict == "none; reason=no_predecessor"
        return
    if n <= 1:
        assert decision.verdict == "none; reason=floor_holds"
        return
    if decision.kind == "none":
        assert decision.verdict == "none; reason=no_room" and decision.capped
        return
    assert decision.kind == "carry" and decision.source_session == prev.session_id
    assert sent[-1] == body["messages"][-1]
    words = [o.provenance for o in decision.origins or ()]
    assert words == ["agent", "inserted", *["carried"] * (len(sent) - 4), "inserted", "agent"]
    assert decision.origins is not None and {
        o.session for o in decision.origins if o.provenance == "carried"} == {prev.session_id}
    carried = [wire_view(m) for m in sent[2:-2]]
    source = transcript_views(prev.objs)
    assert carried == source[-len(carried):], "carried messages are not the old session's end"
    available = sum(1 for v in source if is_raw(v))
    if not decision.capped:
        assert sum(1 for v in carried if is_raw(v)) >= min(n, available)

"""Where a compaction cuts, checked on generated conversations and on real captured requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.facts.learned import BoundedMap, LearnedWindows
from proxy.recovery.plan import (
    Prior,
    compacted_messages,
    fallback_messages,
    find_cut_point,
    runtime_line,
    turn_start,
)
from proxy.recovery.request import derived_session_key
from proxy.wire.boundary import role_problems
from proxy.wire.content import head_length
from proxy.wire.summary import summary_message, unwrap_summary

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compaction"


def conversation(shape: list[int]) -> list[dict[str, Any]]:
    """0: user, 1: assistant text, n >= 2: assistant with n - 1 parallel tool calls + results."""
    out: list[dict[str, Any]] = []
    for k, kind in enumerate(shape):
        if kind == 0:
            out.append({"role": "user", "content": f"user {k}"})
        elif kind == 1:
            out.append({"role": "assistant", "content": f"answer {k}"})
        else:
            ids = [f"c{k}_{j}" for j in range(kind - 1)]
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                for i in ids]})
            out.extend({"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids)
    return out


@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=40),
       costs_seed=st.lists(st.integers(1, 400), min_size=200, max_size=200),
       min_tail=st.integers(0, 12), available=st.integers(0, 4000))
def test_the_cut_keeps_exchanges_whole_and_the_current_turn(
        shape: list[int], costs_seed: list[int], min_tail: int, available: int) -> None:
    messages = conversation(shape)
    costs = costs_seed[:len(messages)]
    cut = find_cut_point(messages, costs, covered=0, min_tail=min_tail, available=available)
    assert 0 <= cut.keep <= cut.turn < len(messages)
    assert not role_problems(messages[cut.keep:])  # no orphan result, no unanswered call
    assert not role_problems(messages[:cut.keep])  # and the summarized part is whole too
    raw_kept = len(messages) - cut.keep
    if cut.trimmed == 0 and cut.keep > 0:
        assert raw_kept >= min(min_tail, len(messages))
    if cut.fits:
        assert sum(costs[cut.keep:]) <= available
    else:  # only the current turn itself can be over the budget
        assert cut.keep == cut.turn


def test_the_current_turn_is_what_follows_the_last_answer() -> None:
    messages = conversation([0, 1, 0, 3])  # user, answer, user, call with 2 results
    assert turn_start(messages, [0, 1, 2, 3]) == 3  # the call and its results, whole
    internal = [*conversation([0, 1, 0]), {"role": "user", "content": "internal context"}]
    assert turn_start(internal, [0, 1, 2, 3]) == 2  # OpenClaw's two trailing user messages


def test_a_prior_summary_is_not_summarized_again() -> None:
    messages = [summary_message("old summary"), *conversation([0, 1] * 6 + [0])]
    prior = Prior.of(messages)
    assert prior == Prior(1, "old summary")
    cut = find_cut_point(messages, [10] * len(messages), covered=prior.covered, min_tail=2,
                   available=1000)
    assert cut.keep == len(messages) - 2


def test_fallback_keeps_the_head_the_summary_a_note_and_the_tail() -> None:
    head = [{"role": "system", "content": "sys"}]
    messages = [summary_message("old"), *conversation([0, 1] * 4)]
    out = fallback_messages(head, messages, Prior.of(messages), keep=7, dropped_tokens=123)
    assert out[0] == head[0] and unwrap_summary(out[1]) == "old"
    assert "6 earlier messages" in json.dumps(out[2]) and "123 tokens" in json.dumps(out[2])
    assert out[3:] == messages[7:]


def test_real_requests_cut_legally() -> None:
    captured = json.loads((FIXTURES / "captured_requests.json").read_text())
    lists = [captured["pi_request8_messages"], captured["oc_request18_messages"]]
    lists += [json.loads(p.read_text())["body"]["messages"]
              for p in sorted((FIXTURES.parent / "floor").glob("*.json"))]
    for messages in lists:
        head = head_length(messages)
        rest = messages[head:]
        prior = Prior.of(rest)
        for min_tail in (1, 3, 30):
            cut = find_cut_point(rest, [50] * len(rest), covered=prior.covered, min_tail=min_tail,
                           available=400)
            assert prior.covered <= cut.keep <= cut.turn
            assert not role_problems(rest[cut.keep:])
            assert rest[-1] in rest[cut.keep:]
    assert len(lists) >= 10


def test_memory_is_bounded_and_learns_windows() -> None:
    seen: BoundedMap[str, int] = BoundedMap(2)
    seen.put("a", 1)
    seen.put("b", 2)
    assert seen.get("a") == 1  # now the most recent
    seen.put("c", 3)
    assert "b" not in seen and len(seen) == 2
    windows = LearnedWindows()
    assert windows.learn("http://up", "m", 8192) and not windows.learn("http://up", "m", 8192)
    assert windows.window("http://up", "m") == 8192 and windows.window("http://other", "m") is None


def test_derived_session_key_follows_the_head_and_the_first_message() -> None:
    head = [{"role": "system", "content": "sys"}]
    one = conversation([0, 1, 0])
    assert derived_session_key("m", head, one) == derived_session_key("m", head, one[:1])
    assert derived_session_key("m", head, one) != derived_session_key("n", head, one)
    assert derived_session_key("m", head, one) != derived_session_key("m", head, one[1:])


def test_openclaws_runtime_line_survives_a_compaction() -> None:
    captured = json.loads((FIXTURES / "captured_requests.json").read_text())
    first_turn = captured["oc_request18_messages"]  # messages[1] ends with the Runtime line
    retry = json.loads((FIXTURES.parent / "floor" / "oc96-r29-overflow-retry.json").read_text())
    for messages in (first_turn, retry["body"]["messages"]):
        rest = messages[head_length(messages):]
        runtime = runtime_line(rest)
        assert runtime is not None and runtime.startswith("Runtime: agent=main | session=")
        out = compacted_messages([messages[0]], "the summary", rest[-1:], None, runtime)
        assert out[1]["content"][-1] == {"type": "text", "text": runtime}
        assert unwrap_summary(out[1]) == "the summary"
        fallback = fallback_messages([messages[0]], rest, Prior(), keep=len(rest) - 1,
                                     dropped_tokens=10)
        assert runtime in json.dumps(fallback[1])
    assert runtime_line(conversation([0, 1])) is None  # Pi: no such line

"""Chunk planning: by token share, whole tool exchanges, every message once and in order."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.recovery.summarize.chunks import Chunk, exchange_units, plan_chunks

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compaction"


def tokens(message: dict[str, Any]) -> int:
    return len(json.dumps(message)) // 4 + 1


def sized(n: int) -> dict[str, Any]:
    # a user message of about n tokens by the counter above
    return {"role": "user", "content": "x" * max(0, 4 * n - 40)}


def call(ids: list[str], text: str = "") -> dict[str, Any]:
    return {"role": "assistant", "content": text or None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        for i in ids]}


def result(call_id: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def test_units_of_a_real_openclaw_request() -> None:
    captured = json.loads((FIXTURES / "captured_requests.json").read_text())
    messages = captured["oc_request18_messages"]
    units = exchange_units(messages)
    exchange = next(u for u in units if u[1] - u[0] > 1)
    assert messages[exchange[0]]["tool_calls"]
    assert [m["role"] for m in messages[exchange[0]:exchange[1]]] == ["assistant", "tool"]
    assert sum(e - s for s, e in units) == len(messages)


def test_parallel_calls_and_a_message_between_results_stay_together() -> None:
    messages = [sized(5), call(["a", "b"]), result("a"), {"role": "user", "content": "hook"},
                result("b"), {"role": "user", "content": "next"}, call(["c"]), result("c"),
                result("stray")]
    assert exchange_units(messages) == [(0, 1), (1, 5), (5, 6), (6, 9)]


def test_unanswered_call_is_a_unit_on_its_own() -> None:
    messages = [call(["a"]), {"role": "user", "content": "hm"}, call(["b"]), result("b")]
    # no result ever came: nothing to keep together, the next messages are units of their own
    assert exchange_units(messages) == [(0, 1), (1, 2), (2, 4)]


def test_fits_in_one_chunk() -> None:
    messages = [sized(10), sized(10)]
    assert plan_chunks(messages, 100, tokens) == (Chunk(0, 2, sum(map(tokens, messages))),)
    assert plan_chunks([], 100, tokens) == ()


def test_split_by_share_is_balanced() -> None:
    messages = [sized(100) for _ in range(10)]  # ~1000 tokens, budget 700 -> 2 chunks of ~500
    chunks = plan_chunks(messages, 700, tokens)
    assert [(c.start, c.end) for c in chunks] == [(0, 5), (5, 10)]


def test_oversized_exchange_stands_alone() -> None:
    messages = [sized(10), call(["a"]), result("a", "y" * 4000), sized(10)]
    chunks = plan_chunks(messages, 300, tokens)
    assert (1, 3) in [(c.start, c.end) for c in chunks]
    assert any(c.tokens > 300 for c in chunks)


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        plan_chunks([sized(1)], 0, tokens)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    counter = 0
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["user", "assistant", "exchange", "stray"]))
        size = draw(st.integers(0, 400))
        if kind == "exchange":
            ids = [f"c{counter + k}" for k in range(draw(st.integers(1, 3)))]
            counter += len(ids)
            messages.append(call(ids))
            for call_id in ids:
                messages.append(result(call_id, "r" * size))
                if draw(st.booleans()) and draw(st.booleans()):
                    messages.append({"role": "user", "content": "interjection"})
        elif kind == "stray":
            messages.append(result("orphan", "s" * size))
        else:
            messages.append({"role": kind, "content": "m" * size})
    return messages


def exchanges(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(call index, result index) pairs: what must never be split."""
    pairs: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or []:
            answered = [j for j in range(i + 1, len(messages))
                        if messages[j].get("tool_call_id") == c["id"]]
            pairs.extend((i, j) for j in answered)
    return pairs


@settings(max_examples=400, deadline=None)
@given(messages=conversations(), budget=st.integers(20, 600))
def test_chunks_cover_every_message_once_in_order_and_never_split_exchanges(
        messages: list[dict[str, Any]], budget: int) -> None:
    chunks = plan_chunks(messages, budget, tokens)
    if not messages:
        assert chunks == ()
        return
    assert chunks[0].start == 0 and chunks[-1].end == len(messages)
    for before, after in itertools.pairwise(chunks):
        assert before.end == after.start
    assert all(c.start < c.end for c in chunks)
    owner = {k: n for n, c in enumerate(chunks) for k in range(c.start, c.end)}
    for call_at, result_at in exchanges(messages):
        assert owner[call_at] == owner[result_at]
    units = exchange_units(messages)
    for c in chunks:
        assert c.tokens == sum(tokens(messages[k]) for k in range(c.start, c.end))
        alone = sum(1 for s, e in units if c.start <= s and e <= c.end) == 1
        assert c.tokens <= budget or alone

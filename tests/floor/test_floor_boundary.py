from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.floor.restore import is_internal, legal_block, to_units
from proxy.wire.boundary import (
    fit_start,
    incomplete_tool_calls,
    is_raw,
    legal_starts,
    orphan_tool_results,
    role_problems,
    tail_start,
    units,
)
from proxy.wire.openclaw import INTERNAL_CONTEXT, OPENCLAW_CONTINUE, normalise_user_text

Msg = dict[str, Any]


def user(text: str = "u") -> Msg:
    return {"role": "user", "content": text}


def assistant(text: str = "a") -> Msg:
    return {"role": "assistant", "content": text}


def call(*ids: str) -> Msg:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        for i in ids]}


def result(call_id: str) -> Msg:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


@st.composite
def conversations(draw: st.DrawFn) -> list[Msg]:
    """Turns with text, parallel tool calls (results shuffled, sometimes missing or
    interrupted), orphan results and stray system messages."""
    messages: list[Msg] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "sys"})
    counter = 0
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(
            ["user", "assistant", "exchange", "exchange", "orphan", "system", "junk"]))
        if kind == "user":
            messages.append(user())
        elif kind == "assistant":
            messages.append(assistant())
        elif kind == "system":
            messages.append({"role": "developer", "content": "note"})
        elif kind == "junk":
            messages.append(draw(st.sampled_from([{}, {"role": "tool"}, {"role": 5}])))
        elif kind == "orphan":
            messages.append(result(f"ghost{counter}"))
            counter += 1
        else:
            ids = [f"c{counter + k}" for k in range(draw(st.integers(1, 3)))]
            counter += len(ids)
            messages.append(call(*ids))
            answered = draw(st.permutations(ids))
            kept = answered[: draw(st.integers(0, len(ids)))] if draw(
                st.integers(0, 4)) == 0 else answered
            interrupt = draw(st.integers(0, 5)) == 0 and len(kept) > 1
            for position, call_id in enumerate(kept):
                if interrupt and position == 1:
                    messages.append(user("interrupting"))
                messages.append(result(call_id))
    return messages


def new_orphans(messages: list[Msg], start: int) -> int:
    before = sum(1 for i in orphan_tool_results(messages) if i >= start)
    return len(orphan_tool_results(messages[start:])) - before


@settings(max_examples=400, deadline=None)
@given(conversations())
def test_legal_starts_are_exactly_the_cuts_that_orphan_nothing(messages: list[Msg]) -> None:
    starts = set(legal_starts(messages))
    for s in range(len(messages)):
        if s in starts:
            assert new_orphans(messages, s) == 0
            assert messages[s].get("role") != "tool"
        elif s > 0 and messages[s].get("role") != "tool":
            assert new_orphans(messages, s) > 0  # the set is maximal


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_units_partition_the_list(messages: list[Msg]) -> None:
    parts = units(messages)
    assert [i for u in parts for i in range(u.start, u.end)] == list(range(len(messages)))
    assert all(u.legal == (u.start in legal_starts(messages)) for u in parts)
    if messages and messages[0].get("role") == "tool":
        assert not parts[0].legal


@settings(max_examples=400, deadline=None)
@given(conversations(), st.integers(-1, 25))
def test_tail_start_is_the_smallest_legal_extension(messages: list[Msg], n: int) -> None:
    starts = legal_starts(messages)
    s = tail_start(messages, n)

    def raw(start: int) -> int:
        return sum(1 for m in messages[start:] if is_raw(m))

    if n <= 0 or not starts:
        assert s == len(messages)
        return
    assert s in starts
    assert new_orphans(messages, s) == 0
    if raw(starts[0]) >= n:
        assert raw(s) >= n
        assert all(raw(later) < n for later in starts if later > s)  # minimal extension
    else:
        assert s == starts[0]  # N larger than the list: keep all that can be kept legally


@settings(max_examples=400, deadline=None)
@given(conversations(), st.data())
def test_fit_start_drops_oldest_whole_units_until_the_budget_fits(
        messages: list[Msg], data: st.DataObject) -> None:
    costs = data.draw(st.lists(st.integers(0, 50), min_size=len(messages),
                               max_size=len(messages)))
    budget = data.draw(st.integers(0, 400))
    lo = data.draw(st.integers(0, len(messages)))
    starts = legal_starts(messages)
    s = fit_start(costs, budget, starts, lo)
    assert s == len(messages) or (s in starts and s >= lo)
    assert sum(costs[s:]) <= budget or s == len(messages)
    earlier = [t for t in starts if lo <= t < s]
    assert all(sum(costs[t:]) > budget for t in earlier)


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_checks_agree_with_legal_cuts(messages: list[Msg]) -> None:
    for s in legal_starts(messages):
        tail = messages[s:]
        problems = role_problems(tail)
        assert len([p for p in problems if "without its assistant" in p]) == len(
            [i for i in orphan_tool_results(messages) if i >= s])


def test_parallel_calls_form_one_exchange() -> None:
    messages = [user(), call("a", "b", "c"), result("b"), result("a"), result("c"), assistant()]
    assert legal_starts(messages) == [0, 1, 5]
    assert [(u.start, u.end) for u in units(messages)] == [(0, 1), (1, 5), (5, 6)]
    assert tail_start(messages, 2) == 1  # 2 messages would start on a tool result
    assert role_problems(messages) == []


def test_missing_results_and_orphans_are_reported() -> None:
    messages = [result("x"), user(), call("a", "b"), result("a"), assistant()]
    assert orphan_tool_results(messages) == [0]
    assert incomplete_tool_calls(messages) == [2]
    assert role_problems(messages) == [
        "message 0: tool result without its assistant tool call",
        "message 2: assistant tool call without all its results"]
    first = units(messages)[0]
    assert (first.start, first.end, first.legal) == (0, 1, False)


def test_interrupted_exchange_cannot_be_entered() -> None:
    messages = [user(), call("a", "b"), result("a"), user("late"), result("b"), assistant()]
    assert legal_starts(messages) == [0, 1, 5]


def test_n_larger_than_the_list_and_empty_inputs() -> None:
    messages = [{"role": "system", "content": "s"}, user(), assistant()]
    assert tail_start(messages, 30) == 0
    assert tail_start(messages, 30, starts=[1, 2]) == 1
    assert tail_start([], 5) == 0
    assert tail_start([result("x")], 5) == 1
    assert fit_start([], 10, []) == 0
    assert fit_start([5, 5, 5], 10, [0, 1, 2]) == 1
    assert fit_start([5, 5, 50], 10, [0, 1, 2]) == 3


def test_duplicate_result_is_an_orphan() -> None:
    messages = [call("a"), result("a"), user(), result("a")]
    assert orphan_tool_results(messages) == [3]
    assert legal_starts(messages) == [0, 2]


_PIECES = st.sampled_from([
    "", " ", "  ", "\n", "\t", "\n\n", "[Mon 2026-11-30 02:27 UTC] ", "[Tue 2026-12-01 10:00] ",
    "[", "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>", "<<<BEGIN", "Continue", "Continue the",
    "Continue the current task from the existing transcript", "current", " task ", "hello",
    "\n\nRuntime: agent=main | session=x", "Runtime: agent=main", "Cont", "inue",
])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=8), st.booleans())
def test_internal_messages_are_found_as_the_normalised_text_shows_them(
        pieces: list[str], as_parts: bool) -> None:
    """The oracle: the user text as both sides normalise it starts with one of OpenClaw's
    markers (the check skips normalising texts that cannot)."""
    text = "".join(pieces)
    content: object = [{"type": "text", "text": text}] if as_parts else text
    expected = normalise_user_text(text).startswith((INTERNAL_CONTEXT, OPENCLAW_CONTINUE))
    assert is_internal({"role": "user", "content": content}) is expected
    assert is_internal({"role": "assistant", "content": content}) is False


@given(conversations(), st.data())
def test_restored_units_are_the_units_of_the_block_with_what_follows(
        messages: list[Msg], data: st.DataObject) -> None:
    """The oracle: ``units`` of block + own, cut at the end of the block."""
    cut = data.draw(st.integers(0, len(messages)))
    block, own = messages[:cut], messages[cut:]
    expected = tuple(tuple(block[u.start:min(u.end, cut)]) for u in units(messages)
                     if u.start < cut)
    assert to_units(block, own) == expected


@given(conversations(), st.data())
def test_a_block_cut_at_a_legal_start_keeps_the_lists_later_starts(
        messages: list[Msg], data: st.DataObject) -> None:
    """Restoring reuses the legal starts of ``before + own`` for the block it cuts from
    ``before``: the oracle is the block's own computation."""
    cut = data.draw(st.integers(0, len(messages)))
    before, own = messages[:cut], messages[cut:]
    n = data.draw(st.integers(0, 12))
    starts = legal_starts(messages)
    start = legal_block(before, own, n, starts)
    assert start == legal_block(before, own, n)
    block = before[start:]
    shifted = [s - start for s in starts if s >= start]
    assert to_units(block, own, shifted) == to_units(block, own)

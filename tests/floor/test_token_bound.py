"""A restore that fits by a bound does not tokenize the request's new messages.

``TokenCounter.request_within`` stands a message's JSON size for a count it does not
remember. The floor counts exactly only when that bound leaves something out. Oracles: the
exact count (the bound is never below it), a spy on what the tokenizer is given, and the
decision a warm counter (every count exact) makes for the same request.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.floor.decision import Decision
from proxy.tokens import ESTIMATE, Encodings, EstimateTokenizer, TokenCounter, Tokenizer
from proxy.transcripts.catalog import Catalog
from tests.floor.harness import FloorHarness
from tests.floor.synthetic import Holder, Transcript, chat, conversation, put, request_for, rules

MARK = "XYZZY-new-tool-output"
BOUNDED = TokenCounter()  # the real tables, shared: loading one costs ~0.4 s


class SpyEncodings(Encodings):
    """The estimate, recording every text it is asked to count."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        spy = self

        class Spy(EstimateTokenizer):
            def count(self, text: str) -> int:
                spy.texts.append(text)
                return super().count(text)

        self._spy: Tokenizer = Spy()

    def get(self, name: str) -> Tokenizer:
        assert name == ESTIMATE
        return self._spy


def compacted(turns: int = 30, pin: bool = False) -> tuple[Catalog, dict[str, Any]]:
    catalog = Catalog()
    t = Transcript("cafe1234-bound")
    if pin:
        t.user("!pin always indent with tabs")
    conversation(t, turns)
    t.compaction("## Goal\nbuild the thing", t.message_ids()[-5])
    t.user("after compaction")
    put(catalog, t)
    body = request_for(catalog, t.session_id, extra=[
        {"role": "assistant", "content": "running it"},
        {"role": "user", "content": f"{MARK} " + "line of output\n" * 400}])
    return catalog, body


def decide(catalog: Catalog, body: dict[str, Any], tokens: TokenCounter,
           window: int = 1_000_000) -> Decision:
    return FloorHarness(Holder(rules(n=40, window=window)), tokens, catalog).decide(
        chat(body), {})


def test_a_restore_that_fits_tokenizes_none_of_the_requests_new_messages() -> None:
    catalog, body = compacted()
    spy = SpyEncodings()
    bounded = decide(catalog, body, TokenCounter(spy))
    assert bounded.kind == "floor" and not bounded.capped
    assert spy.texts and not any(MARK in text for text in spy.texts)
    warm = TokenCounter()
    warm.request(body, ESTIMATE)  # every count of the request remembered: exact
    exact = decide(catalog, body, warm)
    assert bounded.messages == exact.messages and bounded.verdict == exact.verdict
    assert bounded.details["request_tokens_at_most"] >= exact.details["request_tokens"]


def test_pins_added_by_a_bound_tokenize_none_of_the_requests_new_messages() -> None:
    catalog, body = compacted(pin=True)
    spy = SpyEncodings()
    bounded = decide(catalog, body, TokenCounter(spy))
    assert bounded.verdict.endswith("; pinned=1")
    assert not any(MARK in text for text in spy.texts)
    warm = TokenCounter()
    warm.request(body, ESTIMATE)
    assert decide(catalog, body, warm).messages == bounded.messages


def test_a_bound_that_leaves_something_out_is_counted_before_anything_is_dropped() -> None:
    catalog, body = compacted()
    unlimited = decide(catalog, body, TokenCounter())
    exact = TokenCounter().request(body, ESTIMATE).total
    # Room for the request and all it restores by the count, not by the bound (the JSON
    # size of the request's messages is about four times their estimate).
    window = exact + unlimited.added_tokens + 1
    bound, counted = TokenCounter().request_within(body, ESTIMATE, 0.0, lambda _bound: True)
    assert bound > exact + unlimited.added_tokens and not counted
    fitted = decide(catalog, body, TokenCounter(), window=window)
    assert not fitted.capped and fitted.added == unlimited.added
    assert fitted.details["request_tokens"] == exact
    capped = decide(catalog, body, TokenCounter(), window=window - unlimited.added_tokens // 2)
    assert capped.capped and 0 < len(capped.added) < len(unlimited.added)


_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
_PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _TEXT),
    st.builds(lambda d: {"type": "input_audio", "input_audio": {"data": d}}, _TEXT),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, _TEXT),
    st.builds(lambda u: {"type": "input_image", "image_url": u}, _TEXT))
_CALL = st.builds(lambda n, a: {"id": "c1", "type": "function",
                                "function": {"name": n, "arguments": a}}, _TEXT, _TEXT)
_MESSAGE = st.fixed_dictionaries(
    {},
    optional={"role": st.sampled_from(["user", "assistant", "tool", "system"]),
              "content": st.one_of(_TEXT, st.lists(_PART, max_size=4)),
              "name": _TEXT, "reasoning_content": _TEXT, "tool_call_id": _TEXT,
              "tool_calls": st.lists(_CALL, max_size=3)})


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(_MESSAGE, max_size=6), encoding=st.sampled_from(
    ["o200k_base", "cl100k_base", ESTIMATE]), margin=st.sampled_from([0.0, 0.1, 0.35]))
def test_the_bound_is_never_below_the_count(messages: list[dict[str, Any]], encoding: str,
                                             margin: float) -> None:
    body = {"messages": messages, "max_tokens": 100}
    exact = TokenCounter(BOUNDED.encodings).request(body, encoding, margin).total
    fresh = TokenCounter(BOUNDED.encodings)
    bound, counted = fresh.request_within(body, encoding, margin, lambda _bound: True)
    assert bound >= exact
    # a bound that does not fit is counted: the very count, remembered
    assert TokenCounter(BOUNDED.encodings).request_within(
        body, encoding, margin, lambda _bound: False) == (exact, True)
    # exact only where every message has an image (counted: its estimate is not its size)
    assert counted == all(b'"type":"image' in orjson.dumps(m)
                          or b'"type":"input_image' in orjson.dumps(m) for m in messages)
    fresh.request(body, encoding)  # remembered now: the bound is the count
    assert fresh.request_within(body, encoding, margin, lambda _bound: True) == (exact, True)


def test_a_message_twice_in_a_request_is_tokenized_once_when_counted() -> None:
    twice = {"role": "user", "content": f"{MARK} again"}
    body = {"messages": [twice, {"role": "assistant", "content": "ok"}, dict(twice)]}
    spy = SpyEncodings()
    counted = TokenCounter(spy).request_within(body, ESTIMATE, 0.0, lambda _bound: False)
    assert counted == (TokenCounter().request(body, ESTIMATE).total, True)
    assert sum(MARK in text for text in spy.texts) == 1

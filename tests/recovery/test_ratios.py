"""The token ratio learned per upstream and model, and the margin a request is budgeted with."""

from __future__ import annotations

import orjson

from proxy.chat import ChatRequest
from proxy.context import build_context
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.policy.records import RuleSet


def test_a_ratio_is_bounded_and_needs_a_prompt_of_some_size() -> None:
    ratios = TokenRatios()
    assert ratios.learn("u", "m", 1370, 1000) == 1.37
    assert ratios.ratio("u", "m") == 1.37
    assert ratios.ratio("u", "other") is None and ratios.ratio("v", "m") is None
    assert ratios.learn("u", "m", 1380, 1000) is None  # within 5%: kept, not news
    assert ratios.ratio("u", "m") == 1.38
    # One sample moves it by 0.2 at most, and never past 2.0 or below 1.0.
    assert ratios.learn("u", "m", 9000, 1000) == 1.58
    assert ratios.learn("u", "m", 9000, 1000) == 1.78
    assert ratios.learn("u", "m", 9000, 1000) == 1.98
    assert ratios.learn("u", "m", 9000, 1000) is None  # 2.0: moved under 5%, not news
    assert ratios.ratio("u", "m") == 2.0
    assert ratios.learn("u", "m", 500, 1000) == 1.8  # a count below ours counts as ours
    assert ratios.learn("u", "m", 200, 150) is None  # framing tokens would dominate
    assert ratios.ratio("u", "m") == 1.8
    fresh = TokenRatios()
    assert fresh.learn("u", "m", 500, 1000) == 1.0  # a first sample is taken as it is


def test_the_learned_ratio_is_the_margin_of_the_request() -> None:
    rules, windows, ratios = RuleSet(), LearnedWindows(), TokenRatios()
    raw = b'{"model":"local","messages":[{"role":"user","content":"hi"}]}'
    chat = ChatRequest.parse(raw, orjson.loads(raw), None)
    before = build_context(chat, {}, rules, models=ModelFactsResolver(windows, ratios, "u"),
                           sessions=None)
    assert before.spec.margin == rules.unknown_model.margin == 0.2
    ratios.learn("u", "local", 1370, 1000)
    after = build_context(chat, {}, rules, models=ModelFactsResolver(windows, ratios, "u"),
                           sessions=None)
    assert round(after.spec.margin, 3) == 0.37
    assert after.spec.encoding == before.spec.encoding
    # A measured ratio below the rules' margin does not take the operator's room away.
    low = TokenRatios()
    low.learn("u", "local", 1050, 1000)
    kept = build_context(chat, {}, rules, models=ModelFactsResolver(windows, low, "u"),
                           sessions=None)
    assert kept.spec.margin == 0.2

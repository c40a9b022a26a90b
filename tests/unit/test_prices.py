"""The rules' [[prices]]: parsed, matched by glob, and a report priced by them."""

from __future__ import annotations

import pytest

from proxy.cost import costs_of
from proxy.policy.parse import RulesError, parse_rules
from proxy.policy.prices import Price, PriceList, cost_of
from proxy.report import RequestReport, SummaryMade
from proxy.wire.usage import Usage

PRICES = """
[[prices]]
model = "gpt-5*"
input = 1.25
output = 10
cache_read = 0.125

[[prices]]
model = "*"
input = 2
output = 4
"""


def test_prices_parse_in_order_and_the_first_glob_wins() -> None:
    rules = parse_rules([("p.toml", PRICES)])
    assert rules.prices.rows[0] == Price("gpt-5*", 1.25, 10.0, 0.125, None)
    assert rules.prices.price_of("GPT-5-mini") == rules.prices.rows[0]
    assert rules.prices.price_of("llama") == rules.prices.rows[1]
    assert not parse_rules([("empty.toml", "")]).prices
    assert PriceList().price_of("anything") is None


@pytest.mark.parametrize("text, problem", [
    ('[[prices]]\nmodel = "x"\ninput = 1\n', "missing field 'output'"),
    ('[[prices]]\nmodel = "x"\ninput = -1\noutput = 1\n', "must be a number >= 0"),
    ('[[prices]]\nmodel = "x"\ninput = 1\noutput = 1\nper = 3\n', "unknown field 'per'"),
    ('prices = 3\n', "array of tables"),
])
def test_bad_prices_are_named(text: str, problem: str) -> None:
    with pytest.raises(RulesError) as caught:
        parse_rules([("p.toml", text)])
    assert problem in str(caught.value)


def report(**changes: object) -> RequestReport:
    values: dict[str, object] = dict(
        request_id="r", at=0.0, route="chat_completions", model="gpt-5", agent="pi",
        stream=False, status=200, verdict="floor", seconds=1.0, proxy_seconds=0.0,
        usage=Usage(1_000_000, 100_000, None, 200_000), added_tokens=300_000,
        tokens_removed=50_000)
    values.update(changes)
    return RequestReport(**values)  # type: ignore[arg-type]


def test_a_request_priced_by_kind() -> None:
    prices = parse_rules([("p.toml", PRICES)]).prices
    costs = costs_of(report(summary=SummaryMade("cheap", 0.0, 1.0, 10_000, 1_000)), prices)
    assert costs is not None
    # 800k uncached input at 1.25, 200k cached at 0.125, 100k output at 10: 2.025; the
    # floor's 300k at the input price (0.375) is the floor's, not the agent's.
    assert costs.request == pytest.approx(2.025 - 0.375)
    assert costs.floor == pytest.approx(0.375)
    assert costs.saved == pytest.approx(0.0625)
    assert costs.summary == pytest.approx((10_000 * 2 + 1_000 * 4) / 1e6)  # its own row
    assert cost_of(Price("x", 1, 1), cache_write=1_000_000) == 1.0  # the input price


def test_an_unpriced_model_is_not_priced() -> None:
    only = PriceList((Price("gpt-5*", 1, 1),))
    assert costs_of(report(model="claude-x"), only) is None


def test_the_example_file_parses_and_carries_its_date() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "rules" / "examples" / "prices.toml"
    text = path.read_text()
    assert "2026-" in text
    prices = parse_rules([(path.name, text)]).prices
    assert prices.price_of("gpt-5-mini-2026") == prices.rows[0]
    assert prices.price_of("local/qwen") is not None

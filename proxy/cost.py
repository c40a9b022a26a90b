"""What one finished request cost in dollars, by the rules' ``[[prices]]``: the report's
token counts priced (proxy/policy/prices.py). Prometheus and OTLP are given the same value.
Pure: no I/O."""

from __future__ import annotations

from proxy.policy.prices import Costs, PriceList, cost_of
from proxy.report import RequestReport

__all__ = ["costs_of"]


def costs_of(report: RequestReport, prices: PriceList) -> Costs | None:
    """None when no row prices the request's model (it is never guessed)."""
    price = prices.price_of(report.model)
    if price is None:
        return None
    usage = report.usage
    total = 0.0
    if usage is not None and report.status < 400:
        cached = usage.cached_tokens or 0
        total = cost_of(price, input_tokens=max((usage.prompt_tokens or 0) - cached, 0),
                        output_tokens=usage.completion_tokens or 0, cache_read=cached)
    floor = cost_of(price, input_tokens=report.added_tokens)
    summary = 0.0
    made = report.summary
    if made is not None:
        summarizer = prices.price_of(made.model) or price
        summary = cost_of(summarizer, input_tokens=made.prompt_tokens,
                          output_tokens=made.completion_tokens)
    return Costs(request=max(total - floor, 0.0) if total else 0.0, floor=floor,
                 summary=summary, saved=cost_of(price, input_tokens=report.tokens_removed))

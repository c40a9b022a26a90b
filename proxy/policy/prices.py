"""Prices per million tokens, from the rules' optional ``[[prices]]`` tables, and what a
request's tokens cost by them.

There is no built-in price list: prices change, and a guessed price is worse than none. A
model no row names is not priced (``cost_of`` says None), and the caller counts it as such.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.policy.records import Pattern

__all__ = ["Costs", "Price", "PriceList", "cost_of"]

_MILLION = 1_000_000
_CACHE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. ``cache_read`` / ``cache_write``: None means the input price."""

    model: str  # a glob, as the rules' other model patterns
    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True, slots=True)
class Costs:
    """Dollars by kind: ``request`` the agent's own tokens (the upstream's usage, less what
    the floor added), ``floor`` the tokens the floor added, ``summary`` the summarizer's
    calls, ``saved`` the tokens compaction took out, at the input price (an estimate)."""

    request: float = 0.0
    floor: float = 0.0
    summary: float = 0.0
    saved: float = 0.0

    def items(self) -> tuple[tuple[str, float], ...]:
        return (("request", self.request), ("floor", self.floor), ("summary", self.summary),
                ("saved", self.saved))


@dataclass(frozen=True)
class PriceList:
    rows: tuple[Price, ...] = ()
    _patterns: tuple[Pattern, ...] = field(init=False, compare=False, repr=False)
    _found: dict[str, Price | None] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_patterns", tuple(Pattern.of(p.model) for p in self.rows))
        object.__setattr__(self, "_found", {})

    def __bool__(self) -> bool:
        return bool(self.rows)

    def price_of(self, model: str) -> Price | None:
        """The first row whose glob matches ``model``."""
        if model in self._found:
            return self._found[model]
        found = next((row for row, pattern in zip(self.rows, self._patterns, strict=True)
                      if pattern.matches(model)), None)
        if len(self._found) >= _CACHE_LIMIT:
            self._found.clear()
        self._found[model] = found
        return found


def cost_of(price: Price, *, input_tokens: int = 0, output_tokens: int = 0,
            cache_read: int = 0, cache_write: int = 0) -> float:
    """Dollars of these token counts (``input_tokens``: not read from or written to a cache)."""
    read = price.input if price.cache_read is None else price.cache_read
    write = price.input if price.cache_write is None else price.cache_write
    return (input_tokens * price.input + output_tokens * price.output + cache_read * read
            + cache_write * write) / _MILLION

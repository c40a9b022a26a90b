"""A budget for request bytes held in memory at once (chat bodies read to be parsed).

Bytes are taken as they arrive (and again for what decoding a compressed body adds), so a
client that declares a large body and sends nothing holds nothing; they are given back when
the request ends. A body that does not fit gets 503 ``busy`` with ``Retry-After`` instead of
pushing the process past its memory limit. The parsed form of a body is not counted.
"""

from __future__ import annotations

__all__ = ["BodyBudget", "Hold"]


class BodyBudget:
    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0

    def hold(self) -> Hold:
        return Hold(self)


class Hold:
    """What one request holds of the budget."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.amount = 0

    def take(self, amount: int) -> bool:
        """Hold ``amount`` more bytes if they fit (the first bytes of the only holder do)."""
        budget = self._budget
        if budget.held and budget.held + amount > budget.total:
            return False
        budget.held += amount
        self.amount += amount
        return True

    def release(self) -> None:
        self._budget.held = max(0, self._budget.held - self.amount)
        self.amount = 0

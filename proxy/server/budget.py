"""A budget for request bytes held in memory at once (chat bodies read to be parsed).

Each body takes its declared length (or the body limit, when it has none) before it is
read and gives it back when its request ends; one that does not fit gets 503 ``busy`` with
``Retry-After`` instead of pushing the process past its memory limit.
"""

from __future__ import annotations

__all__ = ["BodyBudget"]


class BodyBudget:
    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0

    def take(self, amount: int) -> bool:
        """Hold ``amount`` bytes if they fit (a body alone always fits an empty budget)."""
        if self.held and self.held + amount > self.total:
            return False
        self.held += amount
        return True

    def give(self, amount: int) -> None:
        self.held = max(0, self.held - amount)

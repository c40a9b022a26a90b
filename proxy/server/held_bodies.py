"""A budget for the memory chat request bodies take at once: their bytes, and their parsed
forms as ``body_cost.py`` estimates them before parsing.

Bytes are taken as they arrive (decoded bytes, for a compressed body), so a client that
declares a large body and sends nothing holds nothing; a body that does not fit gets 503
``busy`` with ``Retry-After`` instead of pushing the process past its memory limit. Before a
body is parsed its request reserves what the parse and the stages will add, waiting a
moment (``reserve``) for requests that end to give theirs back. Everything is given back
when the request ends.
"""

from __future__ import annotations

import asyncio

__all__ = ["BodyBudget", "Hold"]


class BodyBudget:
    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self._waiting: list[asyncio.Future[None]] = []

    def hold(self) -> Hold:
        return Hold(self)

    def _given_back(self) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)


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

    async def reserve(self, amount: int, wait: float) -> bool:
        """Hold ``amount`` more bytes, waiting up to ``wait`` seconds for them to fit; False
        if they did not. Waiters are woken whenever bytes are given back, and each looks
        again (no order among them: a few at most, each for a moment)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        budget = self._budget
        while not self.take(amount):
            left = deadline - loop.time()
            if left <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            budget._waiting.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return False
            finally:
                if waiter in budget._waiting:
                    budget._waiting.remove(waiter)
        return True

    def detach(self) -> Hold:
        """What this hold has, moved to a new hold (this one then holds nothing): for work
        that outlives its request (a parse in a worker thread goes on after the client
        left) and gives the bytes back when it ends."""
        moved = Hold(self._budget)
        moved.amount, self.amount = self.amount, 0
        return moved

    def give_back(self, amount: int) -> None:
        """``amount`` of what this hold has, given back early (bytes already sent on)."""
        amount = min(amount, self.amount)
        self.amount -= amount
        budget = self._budget
        budget.held = max(0, budget.held - amount)
        if budget._waiting:
            budget._given_back()

    def release(self) -> None:
        self.give_back(self.amount)

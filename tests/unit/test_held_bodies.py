"""The body budget: a reservation that does not fit waits for what others give back, up to its
bound, and holds nothing when it gives up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from proxy.server.held_bodies import BodyBudget


async def test_a_reservation_waits_for_bytes_given_back() -> None:
    budget = BodyBudget(100)
    first, second = budget.hold(), budget.hold()
    assert first.take(80)
    waiting = asyncio.ensure_future(second.reserve(50, wait=5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done() and budget.held == 80
    first.release()
    assert await asyncio.wait_for(waiting, 1.0)
    assert budget.held == 50 and second.amount == 50


async def test_a_reservation_gives_up_at_its_bound_holding_nothing() -> None:
    budget = BodyBudget(100)
    first, second = budget.hold(), budget.hold()
    assert first.take(80)
    assert second.take(10)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert not await second.reserve(50, wait=0.2)
    assert loop.time() - began >= 0.19
    assert budget.held == 90 and second.amount == 10  # what it held before, no more
    second.release()
    first.release()
    assert budget.held == 0


async def test_every_waiter_looks_again_when_bytes_are_given_back() -> None:
    budget = BodyBudget(100)
    owner = budget.hold()
    assert owner.take(100)
    holds = [budget.hold() for _ in range(3)]
    waiting = [asyncio.ensure_future(h.reserve(30, wait=5.0)) for h in holds]
    await asyncio.sleep(0.05)
    owner.release()
    assert await asyncio.wait_for(asyncio.gather(*waiting), 1.0) == [True, True, True]
    assert budget.held == 90


async def test_a_spilled_body_gives_its_start_back_once_it_is_sent() -> None:
    """A body past the parse bound streams on unread: its first part, sent, is no longer
    held, so a long upstream answer does not keep it counted."""
    from proxy.server.chat_body import Spill

    mib = 1024 * 1024
    budget = BodyBudget(64 * mib)
    hold = budget.hold()
    head = b"h" * (3 * mib + 5)
    assert hold.take(len(head))

    async def rest() -> AsyncIterator[bytes]:
        yield b"tail-1"
        yield b"tail-2"

    held_when: list[tuple[bytes, int]] = []
    async for piece in Spill(head, rest(), hold).body():
        held_when.append((piece[:6], budget.held))
    assert [p for p, _ in held_when[:4]] == [b"h" * 6] * 3 + [b"h" * 5]  # a MiB at a time
    assert [held for _, held in held_when[:4]] == [len(head)] * 4  # held while being sent
    assert held_when[4:] == [(b"tail-1", 0), (b"tail-2", 0)]
    assert hold.amount == 0

"""A large body's parse runs in a worker thread, which cannot be stopped: a request cancelled
meanwhile (its client left) must keep its turn and its share of the body budget until the
thread ends, or the next large bodies start while the first is still being built."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import cast

import pytest

from proxy.server.held_bodies import BodyBudget
from proxy.server.offload import WorkerPool
from proxy.server.parsing import in_thread
from proxy.server.state import ProxyState


def _state() -> ProxyState:
    return cast(ProxyState, SimpleNamespace(parsing=asyncio.Semaphore(1), offload=WorkerPool(2)))


async def _until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not check():
        assert loop.time() < deadline, "never happened"
        await asyncio.sleep(0.01)


async def test_a_request_cancelled_mid_parse_keeps_its_turn_and_share_until_the_thread_ends(
        ) -> None:
    state, budget = _state(), BodyBudget(100)
    hold = budget.hold()
    assert hold.take(60)
    started, finish = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        finish.wait(10)
        return "parsed"

    request = asyncio.ensure_future(in_thread(state, hold, work))
    assert await asyncio.to_thread(started.wait, 5)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    hold.release()  # what the route does when its request ends
    assert budget.held == 60 and state.parsing.locked()  # the thread still builds
    other = budget.hold()
    assert not other.take(50)  # the budget still counts what the thread is making
    finish.set()
    await _until(lambda: not state.parsing.locked())
    assert budget.held == 0 and other.take(50)


async def test_the_turn_is_given_back_after_a_result_and_after_an_error() -> None:
    state, budget = _state(), BodyBudget(100)
    hold = budget.hold()
    assert await in_thread(state, hold, lambda: 7) == 7
    assert not state.parsing.locked()

    def broken() -> None:
        raise ValueError("not JSON")

    with pytest.raises(ValueError):
        await in_thread(state, hold, broken)
    assert not state.parsing.locked()

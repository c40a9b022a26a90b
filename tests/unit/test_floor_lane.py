"""The floor's lane: one decision at a time, a bounded wait, a bounded queue."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from proxy.server.floor_lane import FloorLane


def _blocker(gate: threading.Event, started: threading.Event) -> object:
    def block(_: object) -> str:
        started.set()
        gate.wait(10)
        return "first"
    return block


def test_a_decision_not_started_in_time_is_dropped_and_never_runs() -> None:
    async def scenario() -> None:
        lane = FloorLane(wait=0.05)
        gate, started = threading.Event(), threading.Event()
        ran: list[str] = []
        first = asyncio.ensure_future(lane.decide(_blocker(gate, started), None))
        await asyncio.to_thread(started.wait, 5)
        assert await lane.decide(ran.append, "late") is None  # behind the blocked one
        gate.set()
        assert await first == "first"  # it had started: waited for, however long
        assert await lane.decide(lambda x: x, "next") == "next"
        assert ran == []  # the dropped decision never ran
        assert lane.queued == 0
        lane.close()
    asyncio.run(scenario())


def test_a_decision_already_running_when_time_is_up_is_waited_for() -> None:
    async def scenario() -> None:
        lane = FloorLane(wait=0.05)
        gate = threading.Event()

        def slow(_: object) -> str:
            gate.wait(10)
            return "restored"

        waiting = asyncio.ensure_future(lane.decide(slow, None))
        await asyncio.sleep(0.2)  # well past the wait: its own work, not a queue
        assert not waiting.done()
        gate.set()
        assert await waiting == "restored"
        lane.close()
    asyncio.run(scenario())


def test_the_queue_is_bounded_beyond_it_a_request_is_passed_on_at_once() -> None:
    async def scenario() -> None:
        lane = FloorLane(wait=5.0, backlog=2)
        gate, started = threading.Event(), threading.Event()
        calls: list[int] = []
        first = asyncio.ensure_future(lane.decide(_blocker(gate, started), None))
        await asyncio.to_thread(started.wait, 5)
        queued = [asyncio.ensure_future(lane.decide(calls.append, n)) for n in range(2)]
        await asyncio.sleep(0.05)
        assert lane.queued == 2
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await lane.decide(calls.append, 99) is None  # no room: not queued at all
        assert loop.time() - began < 1.0
        gate.set()
        assert await first == "first"
        await asyncio.gather(*queued)
        assert calls == [0, 1]
        lane.close()
    asyncio.run(scenario())


def test_without_a_bound_a_request_waits_its_turn() -> None:
    async def scenario() -> None:
        lane = FloorLane(wait=None, backlog=1)
        gate, started = threading.Event(), threading.Event()
        first = asyncio.ensure_future(lane.decide(_blocker(gate, started), None))
        await asyncio.to_thread(started.wait, 5)
        waiting = [asyncio.ensure_future(lane.decide(lambda x: x, n)) for n in range(3)]
        await asyncio.sleep(0.1)
        gate.set()
        assert await first == "first"
        assert await asyncio.gather(*waiting) == [0, 1, 2]
        lane.close()
    asyncio.run(scenario())


def _stuck_in_a_loop(gate: threading.Event, started: threading.Event) -> object:
    def decision_stuck_here(_: object) -> str:
        started.set()
        while not gate.wait(0.01):  # a decision that does not end (a loop, a lock)
            pass
        return "done at last"
    return decision_stuck_here


def test_a_decision_that_runs_too_long_is_reported_once_with_where_it_is(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        for wait in (None, 0.02):
            caplog.clear()
            lane = FloorLane(wait=wait, slow=0.1)
            gate, started = threading.Event(), threading.Event()
            first = asyncio.ensure_future(lane.decide(_stuck_in_a_loop(gate, started), None))
            try:
                await asyncio.to_thread(started.wait, 5)
                behind = [asyncio.ensure_future(lane.decide(lambda x: x, n)) for n in range(3)]
                await asyncio.sleep(0.5)  # several waiters, several polls past ``slow``
                assert not first.done()
            finally:
                gate.set()  # a failed check must not leave the lane's thread looping
            assert await first == "done at last"
            reports = [r for r in caplog.records if r.name == "tailfloor.floor"
                       and r.levelno == logging.WARNING]
            assert len(reports) == 1, [r.getMessage() for r in reports]
            assert "decision_stuck_here" in str(getattr(reports[0], "stack", ""))
            assert "a floor decision has run for" in reports[0].getMessage()
            answers = await asyncio.gather(*behind)
            assert answers == ([0, 1, 2] if wait is None else [None, None, None])
            lane.close()
    with caplog.at_level(logging.WARNING, logger="tailfloor.floor"):
        asyncio.run(scenario())


def test_decisions_that_end_in_time_are_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        lane = FloorLane(wait=None, slow=0.2)
        for n in range(20):
            assert await lane.decide(lambda x: (time.sleep(0.01), x)[1], n) == n
        lane.close()
    with caplog.at_level(logging.WARNING, logger="tailfloor.floor"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.name == "tailfloor.floor"]


def test_a_slow_decision_is_reported_while_requests_wait_their_bounded_time(
        caplog: pytest.LogCaptureFixture) -> None:
    """With ``--floor-wait-ms`` longer than ``slow``: the report comes within the wait, not
    after it (a decision that ends before the wait is up was still slow)."""
    async def scenario() -> None:
        lane = FloorLane(wait=2.0, slow=0.1)
        gate, started = threading.Event(), threading.Event()
        first = asyncio.ensure_future(lane.decide(_stuck_in_a_loop(gate, started), None))
        try:
            await asyncio.to_thread(started.wait, 5)
            behind = asyncio.ensure_future(lane.decide(lambda x: x, 1))
            await asyncio.sleep(0.5)
            reports = [r for r in caplog.records if r.name == "tailfloor.floor"]
            assert len(reports) == 1 and "(1 queued behind it)" in reports[0].getMessage()
        finally:
            gate.set()
        assert await first == "done at last"
        assert await behind == 1
        lane.close()
    with caplog.at_level(logging.WARNING, logger="tailfloor.floor"):
        asyncio.run(scenario())

"""What survives a full garbage collection is frozen, and unfrozen now and then:
proxy/server/full_collections.py. Each test leaves the collector as it found it."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.server import full_collections
from proxy.server.full_collections import freeze_survivors, unfreeze_now_and_then
from tests.unit.served_with import served_with_a_marked_task


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def collector() -> Iterator[None]:
    gc.collect()
    gc.unfreeze()
    undo = freeze_survivors()
    try:
        yield
    finally:
        undo()
        gc.unfreeze()
        full_collections._Thaw.pending, full_collections._Thaw.found = False, None


def _walked(obj: object) -> bool:
    """Whether the collector's walks reach ``obj`` (a frozen object is in no generation)."""
    return any(item is obj for item in gc.get_objects())


@pytest.mark.usefixtures("collector")
def test_a_full_collection_freezes_what_survived_it_and_no_other_does() -> None:
    kept = [Node() for _ in range(1000)]
    gc.collect(1)  # a younger generation: nothing frozen
    assert _walked(kept[0]) and gc.get_freeze_count() == 0
    gc.collect()
    assert gc.get_freeze_count() >= len(kept)
    assert not _walked(kept[0]) and not _walked(kept)
    young = Node()  # made after the freeze: walked until the next full collection
    assert _walked(young)


@pytest.mark.usefixtures("collector")
def test_frozen_objects_still_go_with_their_last_reference() -> None:
    kept = Node()
    gone = weakref.ref(kept)
    gc.collect()
    assert not _walked(kept)
    del kept
    assert gone() is None


@pytest.mark.usefixtures("collector")
def test_a_frozen_cycle_is_found_once_unfrozen_and_the_next_thaw_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    gc.collect()  # alive: frozen
    del first, second
    gc.collect()
    assert gone() is not None  # unreachable, but frozen: no collection walks it

    async def thaw_collect_thaw() -> None:
        task = asyncio.create_task(unfreeze_now_and_then(every=0))
        await _turns(3)  # the task's sleep and its thaw, a turn of the loop each
        assert gc.get_freeze_count() == 0
        gc.collect()  # the full collection after the thaw
        assert gone() is None
        await _turns(3)  # the next thaw, which logs what that collection found
        task.cancel()

    with caplog.at_level(logging.INFO, logger="tailfloor"):
        asyncio.run(thaw_collect_thaw())
    found = [r.getMessage() for r in caplog.records if "after the last thaw" in r.getMessage()]
    assert len(found) == 1
    assert int(found[0].split("freed ")[1].split()[0]) >= 2  # the two nodes, at least


async def _turns(count: int) -> None:
    for _turn in range(count):
        await asyncio.sleep(0)


def test_undo_stops_the_freezing() -> None:
    gc.collect()
    gc.unfreeze()
    undo = freeze_survivors()
    undo()
    try:
        gc.collect()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_the_server_freezes_survivors_and_runs_the_unfreeze_while_it_serves(
        tmp_path: Path) -> None:
    # the served process's unfreeze task swapped for one that first says whether a full
    # collection froze what survived it (what start-up froze itself unfrozen before)
    first, out, status, err = served_with_a_marked_task("unfreeze_now_and_then", """
        gc.unfreeze()
        gc.collect()
        print("frozen by a full collection:", gc.get_freeze_count() > 0, flush=True)
    """, tmp_path)
    assert (first, out, status) == ("frozen by a full collection: True", "stopped", 0), err

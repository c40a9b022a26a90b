"""What survives a full garbage collection is frozen, and unfrozen now and then:
proxy/server/full_collections.py. Each test leaves the collector as it found it."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

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
def test_a_frozen_cycle_is_found_once_unfrozen() -> None:
    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    gc.collect()  # alive: frozen
    del first, second
    gc.collect()
    assert gone() is not None  # unreachable, but frozen: no collection walks it
    asyncio.run(_one_unfreeze())
    gc.collect()
    assert gone() is None


async def _one_unfreeze() -> None:
    task = asyncio.create_task(unfreeze_now_and_then(every=0))
    for _turn in range(3):  # the task's sleep and its unfreeze, a turn of the loop each
        await asyncio.sleep(0)
    task.cancel()
    assert gc.get_freeze_count() == 0


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

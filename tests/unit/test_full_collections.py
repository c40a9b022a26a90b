"""What survives a full garbage collection is frozen, and unfrozen now and then:
proxy/server/full_collections.py. Each test leaves the collector as it found it."""

from __future__ import annotations

import asyncio
import gc
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.server.full_collections import freeze_survivors, unfreeze_now_and_then


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


# The served process with its unfreeze task swapped for one that says whether a full
# collection froze what survived it, and when the task stops: how ``tailfloor serve`` sets
# the collector up.
_SERVED = textwrap.dedent("""
    import asyncio, gc, sys
    from proxy.cli.main import main
    from proxy.server import app

    async def marked_unfreeze():
        gc.unfreeze()  # what start-up froze itself
        gc.collect()
        print("frozen by a full collection:", gc.get_freeze_count() > 0, flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            print("unfreeze stopped", flush=True)

    app.unfreeze_now_and_then = marked_unfreeze
    sys.exit(main(sys.argv[1:]))
""")


def test_the_server_freezes_survivors_and_runs_the_unfreeze_while_it_serves(
        tmp_path: Path) -> None:
    served = subprocess.Popen(
        [sys.executable, "-c", _SERVED, "serve", "--listen", "127.0.0.1:0",
         "--admin-listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9",
         "--sessions", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a server that never starts the task prints nothing: the timer ends the wait
    deadline = threading.Timer(30, served.kill)
    deadline.start()
    try:
        assert served.stdout is not None
        first = served.stdout.readline().strip()
        served.send_signal(signal.SIGTERM)
        out, err = served.communicate(timeout=30)
    finally:
        deadline.cancel()
        served.kill()
    assert first == "frozen by a full collection: True", (first, err)
    assert served.returncode == 0, err
    assert out.strip() == "unfreeze stopped", (out, err)

"""Python's full garbage collections walk only what is new: what survived one is frozen.

A full collection walks every object the collector tracks, with the interpreter held. A busy
tailfloor tracks a few hundred thousand objects that live for minutes (the windows of the
sessions at work: some 230,000 entries for a thousand agents), and walking them took 170 to
480 ms, every 40 to 120 s, longer as the heap aged (docs/benchmarks.md, "A thousand agents
on one replica"): a pause that every request in flight waits out. None of those
collections freed anything. What lives long here goes when its last reference does, not by
being found in a cycle. Frozen, the same run's full collections took 75 to 147 ms.

So after each full collection, what survived it is frozen (``gc.freeze``: moved to a
generation no collection walks), and the next one walks only what came since. A frozen
object is still freed when its last reference goes; only a reference cycle among frozen
objects is not found while they stay frozen. Once an hour (``UNFREEZE_EVERY``)
``unfreeze_now_and_then`` moves them all back, and the next full collection walks
everything once, as before, finding any such cycle.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

__all__ = ["UNFREEZE_EVERY", "freeze_survivors", "unfreeze_now_and_then"]

UNFREEZE_EVERY = 3600.0


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    # Called by the collector in whichever thread triggered it, with the interpreter held.
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def freeze_survivors() -> Callable[[], None]:
    """From now on, every full collection freezes what survived it; returns the undo."""
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)

    def undo() -> None:
        while _after_collection in gc.callbacks:
            gc.callbacks.remove(_after_collection)

    return undo


async def unfreeze_now_and_then(every: float = UNFREEZE_EVERY) -> None:
    """Every ``every`` seconds, unfreeze everything: the next full collection walks it all
    once. Until cancelled."""
    while True:
        await asyncio.sleep(every)
        gc.unfreeze()

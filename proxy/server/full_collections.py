"""Python's full garbage collections walk only what is new: what survived one is frozen.

A full collection walks every object the collector tracks, with the interpreter held. A busy
tailfloor tracks a few hundred thousand objects that live for minutes (the windows of the
sessions at work: some 230,000 entries for a thousand agents), and walking them took 170 to
480 ms, every 40 to 120 s, longer as the heap aged (docs/benchmarks.md, "A thousand agents
on one replica"): a pause that every request in flight waits out. None of those
collections freed anything: what lives long here goes when its last reference does, not by
being found in a cycle. Frozen, the same load's full collections took 75 to 147 ms.

So after each full collection, what survived it is frozen (``gc.freeze``: moved to a
generation no collection walks), and the next one walks only what came since. A frozen
object is still freed when its last reference goes; only a reference cycle among frozen
objects (one alive at the moment of a full collection that died later: an exception and
its frames, say) is not found while they stay frozen. So once an hour (``UNFREEZE_EVERY``)
``unfreeze_now_and_then`` moves everything back, what start-up froze included, and the
next full collection walks it all once, finding any such cycle; each thaw logs how many
objects it moved back and what the full collection after the last one found.

On Python 3.11 to 3.13, whose collector reports each full collection as generation 2.
3.14's collector walks the old generation in increments of its own: left alone there.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["UNFREEZE_EVERY", "freeze_survivors", "unfreeze_now_and_then"]

log = logging.getLogger("tailfloor")

UNFREEZE_EVERY = 3600.0
_APPLIES = sys.version_info < (3, 14)


class _Thaw:
    """What the full collection after a thaw found: written by the collector's callback
    (any thread), read by the thaw task."""

    pending = False
    found: int | None = None


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    # Called by the collector in whichever thread triggered it, with the interpreter held;
    # no logging here (it may run inside a log call of the same thread).
    if phase == "stop" and info.get("generation") == 2:
        if _Thaw.pending:
            _Thaw.pending, _Thaw.found = False, info.get("collected", 0)
        gc.freeze()


def freeze_survivors() -> Callable[[], None]:
    """From now on, every full collection freezes what survived it; returns the undo."""
    if _APPLIES and _after_collection not in gc.callbacks:
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
        if _Thaw.found is not None:
            log.info("the full garbage collection after the last thaw freed %d objects "
                     "found in reference cycles", _Thaw.found)
            _Thaw.found = None
        moved = gc.get_freeze_count()
        _Thaw.pending = True
        gc.unfreeze()
        log.debug("thawed %d frozen objects: the next full garbage collection walks them",
                  moved)

"""Request bodies still arriving when the drain begins.

A body read has its own deadline (the minimum upload rate). At SIGTERM each read in
progress is given until a share of the grace period instead, so that a request whose body
is still coming is either read in time to be answered or refused with a 503
(``shutting_down``) before the drain ends: never left without an answer when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

__all__ = ["BODY_SHARE", "BodyReads"]

BODY_SHARE = 0.5  # of the grace period, for the bodies still arriving; the rest to answer


class BodyReads:
    def __init__(self) -> None:
        self._open: set[asyncio.Timeout] = set()
        self.draining = False
        self._until: float | None = None  # loop time by which bodies must have arrived

    @contextlib.contextmanager
    def reading(self, deadline: asyncio.Timeout) -> Iterator[None]:
        """A body read under ``deadline`` (entered): shortened when the drain begins."""
        self._shorten(deadline)
        self._open.add(deadline)
        try:
            yield
        finally:
            self._open.discard(deadline)

    def drain(self, grace: float) -> None:
        """The drain began: every body read in progress (or begun later) has until
        ``BODY_SHARE`` of ``grace`` seconds from now."""
        self.draining = True
        self._until = asyncio.get_running_loop().time() + grace * BODY_SHARE
        for deadline in self._open:
            self._shorten(deadline)

    def _shorten(self, deadline: asyncio.Timeout) -> None:
        if deadline.expired():
            return  # fired already, its task not yet resumed: rescheduling it would raise
        when = deadline.when()
        if self._until is not None and (when is None or when > self._until):
            deadline.reschedule(self._until)

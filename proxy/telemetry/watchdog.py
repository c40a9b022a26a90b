"""The watchdog of an endpoint's posts: what bounds a post as a whole, not per read (a
socket's timeout applies to each operation, so a collector that dribbles its answer a byte at
a time would hold the poster, and a shutdown waiting on it, for as long as it likes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Watchdog"]


class Watchdog:
    """One thread for all of an endpoint's posts, not a timer each (starting a thread per
    post cost more than the post): it calls ``abort(post)`` once the post armed last is
    still under way at its deadline. ``abort`` checks the post's number itself, so a call
    that comes too late for its post leaves the next one alone. The thread starts with the
    first post and ends after a minute without one."""

    _IDLE = 60.0

    def __init__(self, abort: Callable[[int], None]) -> None:
        self._abort = abort
        self._changed = threading.Condition()
        self._armed: tuple[int, float] | None = None
        self._running = False
        self._stopping = False

    def arm(self, post: int, deadline: float) -> None:
        with self._changed:
            self._armed = (post, deadline)
            self._stopping = False
            if not self._running:
                self._running = True
                threading.Thread(target=self._watch, name="tailfloor-otlp-watchdog",
                                 daemon=True).start()
            self._changed.notify()

    def disarm(self, post: int) -> None:
        with self._changed:
            if self._armed is not None and self._armed[0] == post:
                self._armed = None

    def stop(self) -> None:
        """End the thread now (a later ``arm`` starts it again)."""
        with self._changed:
            self._armed = None
            self._stopping = True
            self._changed.notify()

    def _watch(self) -> None:
        while True:
            with self._changed:
                armed = self._armed
                if armed is None:
                    if self._stopping or (not self._changed.wait(self._IDLE)
                                          and self._armed is None):
                        self._running = False
                        return
                    continue
                post, deadline = armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self._armed = None
            self._abort(post)

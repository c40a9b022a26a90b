"""What the operator reads when the upstream fails: one line when an episode starts (which
failure, and what to do), the rest only counted, and one line when it answers again.

An episode is a run of failures of one kind (cannot connect, TLS, timeout, the answer
broke) or of refused credentials (401/403 answers, which the client gets as they came:
tailfloor passes the agent's key on as the agent sent it). An upstream that fails now and
then (one answer in ten cut off) makes an episode of each failure: a kind warned about in
the last ``QUIET`` seconds is only counted, and warned about again once that time is past,
if it still fails. Every failure no line told is told by the next one: the kind's next
warning, or the line saying the upstream answers again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["QUIET", "UpstreamEpisodes"]

log = logging.getLogger("tailfloor.upstream")
QUIET = 300.0  # seconds after a warning during which failures of its kind are only counted
_HINTS = {
    "connect": "is the model server running, and is --upstream (TAILFLOOR_UPSTREAM) its "
               "address?",
    "timeout": "the upstream is slow or unreachable; --connect-timeout and --read-timeout "
               "bound the wait",
}


class UpstreamEpisodes:
    def __init__(self, upstream: str = "", clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.upstream = upstream
        self._clock = clock
        self._failing: str | None = None  # the kind of the episode going on
        self._logged = False  # whether the episode going on was warned about
        self._warned_at: dict[str, float] = {}  # kind -> when it was last warned about
        self._untold: dict[str, int] = {}  # kind -> failures no line has told yet
        self._open = False  # a warning was logged, and no "answers again" since
        self._last_warned = ""  # the kind of the last warning
        self._refused = False

    def failed(self, kind: str, message: str, cause: str | None = None) -> None:
        """``cause``: what the hint is chosen by (the failure's own reason), when it is not
        ``kind`` (a stream that went silent mid-way is a ``mid_stream`` failure, and a
        timeout)."""
        if self._failing != kind:
            self._failing, self._logged = kind, False
        last = self._warned_at.get(kind)
        now = self._clock()
        if self._logged or (last is not None and now - last < QUIET):
            self._untold[kind] = self._untold.get(kind, 0) + 1
            return
        self._warned_at[kind] = now
        self._logged = self._open = True
        self._last_warned = kind
        untold = self._untold.pop(kind, 0)
        # A stream that went silent mid-way is a timeout too; one broken off is not a
        # failure to connect, whatever its exception says.
        hint = _HINTS.get(kind) or (_HINTS["timeout"] if cause == "timeout" else "")
        log.warning("the upstream %s failed (%s): %s%s; the client got an error, further "
                    "failures like this are only counted (tailfloor_upstream_errors_total)%s",
                    self.upstream, kind, message, f"; {hint}" if hint else "",
                    f" ({untold} more since the last warning were only counted)"
                    if untold else "")

    def answered(self, status: int) -> None:
        if status in (401, 403):
            if not self._refused:
                self._refused = True
                log.warning("the upstream %s refused a request's credentials (%d): the "
                            "agent's API key is missing or wrong (tailfloor passes it on as "
                            "the agent sent it); further refusals are only counted",
                            self.upstream, status)
            return
        if status >= 400:
            return
        self._refused = False
        self._failing, self._logged = None, False
        if not self._open:
            return  # nothing warned about is going on: what was counted waits for a warning
        self._open = False
        untold, self._untold = self._untold, {}
        total = sum(untold.values())
        if len(untold) <= 1:
            kind = next(iter(untold), self._last_warned)
            detail = f"{total} more {kind} failures were only counted"
        else:
            detail = f"{total} more failures were only counted: " + ", ".join(
                f"{count} {kind}" for kind, count in sorted(untold.items()))
        log.info("the upstream %s answers again (%s)", self.upstream, detail)

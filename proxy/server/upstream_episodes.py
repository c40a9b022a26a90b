"""What the operator reads when the upstream fails: one line when an episode starts (which
failure, and what to do), the rest only counted, and one line when it answers again.

An episode is a run of failures of one kind (cannot connect, TLS, timeout, the answer
broke) or of refused credentials (401/403 answers, which the client gets as they came:
tailfloor passes the agent's key on as the agent sent it). An upstream that fails now and
then (one answer in ten cut off) makes an episode of each failure: a kind already warned
about in the last ``QUIET`` seconds starts its next episodes without a line, and the next
warning after that says how many failures went unlogged meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["QUIET", "UpstreamEpisodes"]

log = logging.getLogger("tailfloor.upstream")
QUIET = 300.0  # seconds after a warning during which a new episode of its kind is only counted
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
        self._left_out = 0
        self._logged = False  # whether the episode going on was warned about
        # kind -> (when last warned, failures of that kind not logged since)
        self._warned: dict[str, tuple[float, int]] = {}
        self._refused = False

    def failed(self, kind: str, message: str) -> None:
        if self._failing == kind:
            self._left_out += 1
            return
        self._end_episode(answering=False)
        self._failing, self._left_out = kind, 0
        now = self._clock()
        last, unlogged = self._warned.get(kind, (None, 0))
        if last is not None and now - last < QUIET:
            self._warned[kind] = (last, unlogged + 1)
            self._logged = False
            return
        self._warned[kind] = (now, 0)
        self._logged = True
        since = f" ({unlogged} more since the last warning were only counted)" \
            if unlogged else ""
        hint = _HINTS.get(kind, "")
        log.warning("the upstream %s failed (%s): %s%s; the client got an error, further "
                    "failures like this are only counted (tailfloor_upstream_errors_total)%s",
                    self.upstream, kind, message, f"; {hint}" if hint else "", since)

    def answered(self, status: int) -> None:
        if status in (401, 403):
            if not self._refused:
                self._refused = True
                log.warning("the upstream %s refused a request's credentials (%d): the "
                            "agent's API key is missing or wrong (tailfloor passes it on as "
                            "the agent sent it); further refusals are only counted",
                            self.upstream, status)
            return
        if status < 400:
            self._refused = False
            self._end_episode(answering=True)

    def _end_episode(self, *, answering: bool) -> None:
        """The episode going on is over: the upstream answers (``answering``), or failed
        in another way."""
        kind = self._failing
        if kind is None:
            return
        if self._logged:
            if answering:
                log.info("the upstream %s answers again (%d more %s failures were only "
                         "counted)", self.upstream, self._left_out, kind)
        else:  # a quiet episode: its failures are told with the kind's next warning
            last, unlogged = self._warned[kind]
            self._warned[kind] = (last, unlogged + self._left_out)
        self._failing, self._left_out, self._logged = None, 0, False

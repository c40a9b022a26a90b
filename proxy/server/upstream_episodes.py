"""What the operator reads when the upstream fails: one line when an episode starts (which
failure, and what to do), the rest only counted, and one line when it answers again.

An episode is a run of failures of one kind (cannot connect, TLS, timeout, the answer
broke) or of refused credentials (401/403 answers, which the client gets as they came:
tailfloor passes the agent's key on as the agent sent it).
"""

from __future__ import annotations

import logging

__all__ = ["UpstreamEpisodes"]

log = logging.getLogger("tailfloor.upstream")
_HINTS = {
    "connect": "is the model server running, and is --upstream (TAILFLOOR_UPSTREAM) its "
               "address?",
    "timeout": "the upstream is slow or unreachable; --connect-timeout and --read-timeout "
               "bound the wait",
}


class UpstreamEpisodes:
    def __init__(self, upstream: str = "") -> None:
        self.upstream = upstream
        self._failing: str | None = None  # the kind of the episode going on
        self._left_out = 0
        self._refused = False

    def failed(self, kind: str, message: str) -> None:
        if self._failing == kind:
            self._left_out += 1
            return
        self._failing, self._left_out = kind, 0
        hint = _HINTS.get(kind, "")
        log.warning("the upstream %s failed (%s): %s%s; the client got an error, further "
                    "failures like this are only counted (tailfloor_upstream_errors_total)",
                    self.upstream, kind, message, f"; {hint}" if hint else "")

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
            if self._failing is not None:
                log.info("the upstream %s answers again (%d more %s failures were only "
                         "counted)", self.upstream, self._left_out, self._failing)
                self._failing, self._left_out = None, 0

"""What the health process answers, from what it has heard of the proxy's event loop. Pure:
no I/O.

The health process asks the loop (one byte down a pipe) when a probe comes and no question
is outstanding; the loop answers with one byte, its readiness. Nothing is asked while
nobody probes, so an idle proxy is never woken for its probes. ``/healthz`` is answered at
once once the loop has answered at all: live unless a question has waited longer than
``stale_after``. ``/readyz`` (and the first ``/healthz``) waits, bounded by the health
process, for the loop's next answer, so it says what the loop says now, not what it said
at the last probe."""

from __future__ import annotations

__all__ = ["INDEXING", "NEAR_LIMIT", "NOT_READY", "READY", "STARTING", "WATCHER_DOWN",
           "Heard", "answer", "readiness_byte"]

READY = 0
STARTING, INDEXING, WATCHER_DOWN, NEAR_LIMIT = 1, 2, 3, 4
# What /readyz says for each code, on the proxy's own listeners and the health process alike.
NOT_READY: dict[int, str] = {
    STARTING: "not ready",
    INDEXING: "not ready: indexing transcripts",
    WATCHER_DOWN: "not ready: the transcript watcher is down",
    NEAR_LIMIT: "not ready: near the client connection limit",
}
HEALTHZ, READYZ = b"/healthz", b"/readyz"


def readiness_byte(code: int) -> bytes:
    """The loop's answer on the wire."""
    return bytes((code,))


class Heard:
    """What the health process knows of the loop: the question outstanding since when, and
    the last readiness it answered. (Not a dataclass: importing dataclasses adds 2 MB to the
    health process, which imports this module and little else.)"""

    __slots__ = ("asked_at", "readiness")

    def __init__(self) -> None:
        self.asked_at: float | None = None
        self.readiness: int | None = None

    def ask(self, now: float) -> bool:
        """Whether a question must go to the loop now (none is outstanding)."""
        if self.asked_at is not None:
            return False
        self.asked_at = now
        return True

    def answered(self, message: bytes) -> bool:
        """Take the loop's answers (the last one counts; a code this side does not know
        reads as not ready, and still answers the question); whether there was one."""
        if not message:
            return False
        code = message[-1]
        self.asked_at = None
        self.readiness = code if code == READY or code in NOT_READY else STARTING
        return True

    def silent_for(self, now: float) -> float:
        return 0.0 if self.asked_at is None else now - self.asked_at


def probed_path(method: bytes, target: bytes) -> bytes | None:
    """The probe asked for, or None for a request this port does not serve."""
    path = target.split(b"?", 1)[0]
    return path if method in (b"GET", b"HEAD") and path in (HEALTHZ, READYZ) else None


def answer(method: bytes, target: bytes, heard: Heard, now: float,
           stale_after: float) -> tuple[int, str]:
    """Status and text for one request."""
    path = probed_path(method, target)
    if path is None:
        if method not in (b"GET", b"HEAD"):
            return 405, "method not allowed\n"
        return 404, "not found: this port answers /healthz and /readyz\n"
    silent = heard.silent_for(now)
    if silent > stale_after:
        return 503, f"not live: the event loop has not answered for {silent:.1f} s\n"
    if heard.readiness is None:  # started, but the loop has not answered once yet
        return 503, "starting: no answer from the event loop yet\n"
    if path == HEALTHZ:
        return 200, "ok\n"
    if heard.readiness == READY:
        return 200, "ready\n"
    return 503, NOT_READY[heard.readiness] + "\n"

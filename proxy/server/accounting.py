"""One request's bookkeeping, the same for the chat route and the passthrough.

The request id (the client's ``x-request-id`` or ours; every log line carries it), the
in-flight gauge, the status the request ended with (499, nginx's "client closed request",
when the client left before the answer was complete), the access log line, and the request
and duration series: written once, here.
"""

from __future__ import annotations

import logging
import re
import time

from aiohttp import web

from proxy.logs import REQUEST_ID
from proxy.server.state import ProxyState

__all__ = ["CLIENT_CLOSED", "Accounting"]

ACCESS_LOG = logging.getLogger("tailfloor.access")
_PLAIN_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
CLIENT_CLOSED = 499


def request_id(state: ProxyState, request: web.Request) -> str:
    """The client's ``x-request-id`` when it is a plain id (it goes into every log line and
    answer header of the request), else ours."""
    offered = request.headers.get("x-request-id")
    found = offered if offered is not None and _PLAIN_ID.fullmatch(offered) \
        else state.next_request_id()
    REQUEST_ID.set(found)
    return found


def refused(request: web.Request, status: int, reason: str, rid: str) -> None:
    """The access line of a request refused before it was routed (one line per request,
    whatever its target holds: the formatter escapes it)."""
    if ACCESS_LOG.isEnabledFor(logging.INFO):
        token = REQUEST_ID.set(rid)
        try:
            ACCESS_LOG.info("%s %s %d refused; reason=%s", request.method, request.path,
                            status, reason, extra={"status": status, "route": "other"})
        finally:
            REQUEST_ID.reset(token)


class Accounting:
    def __init__(self, state: ProxyState, request: web.Request, route: str) -> None:
        self.state = state
        self.request = request
        self.route = route
        self.started = time.perf_counter()
        self.request_id = request_id(state, request)
        self.status = 500
        self.model: str | None = None  # chat route: the model label is the request's model
        self.verdict: str | None = None
        self.gone = False
        state.metrics.in_flight.inc()

    def answer(self, response: web.StreamResponse, *, gone: bool = False) -> web.StreamResponse:
        self.status = response.status
        self.gone = self.gone or gone
        return response

    def finish(self) -> None:
        metrics = self.state.metrics
        metrics.in_flight.dec()
        code = CLIENT_CLOSED if self.gone else self.status
        if self.gone:
            metrics.client_disconnects.inc()
        elapsed = time.perf_counter() - self.started
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            extra: dict[str, object] = {"status": code, "route": self.route,
                                        "ms": round(elapsed * 1e3, 3)}
            if self.model is not None:
                extra["model"] = self.model
            if self.verdict is not None:
                extra["verdict"] = self.verdict
            ACCESS_LOG.info("%s %s %d %s", self.request.method, self.request.path, code,
                            self.verdict or "", extra=extra)
        label = metrics.model_label(self.model) if self.model is not None else "none"
        metrics.requests_by(self.route, label, str(code)).inc()
        metrics.duration_by(self.route, label).observe(elapsed)

"""What happened to one chat request, stage by stage, as the values the stages returned.

The exchange fills one ``Trail`` as the request goes (the context, the floor's ``Decision``,
recovery's ``Prepared``, ``ErrorStep`` and ``AfterCheck``, every upstream ``Attempt``, the
relay's ``StreamOutcome``, the answer's usage) and hands it to the ``Recorder`` once, when
the client has its answer, whatever way it ended. The recorder turns it into metrics, log
lines and the ``RequestReport`` the inspector and telemetry read; nothing else records.
"""

from __future__ import annotations

import time

from proxy.chat import ChatRequest
from proxy.context import RequestContext
from proxy.errors import ProxyError
from proxy.floor.decision import Decision
from proxy.recovery.outcome import AfterCheck, ErrorStep, Prepared
from proxy.report import Attempt
from proxy.server.outgoing import Outgoing
from proxy.server.relay import StreamOutcome
from proxy.telemetry.tracecontext import TraceContext
from proxy.wire.usage import Usage

__all__ = ["Trail"]


class Trail:
    """Built for every request: its defaults live on the class, so making one sets four
    attributes (a dataclass of this size set thirty, with two lists, on every request)."""

    ctx: RequestContext | None = None
    waited: tuple[str, float] | None = None  # for the transcript: (outcome, seconds)
    decision: Decision | None = None
    prepared: Prepared | None = None
    steps: tuple[ErrorStep, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    outgoing: Outgoing | None = None  # what the last attempt sent
    stream_options_refused: bool = False  # the upstream refused the usage request
    failure: ProxyError | None = None  # no answer (an attempt failed, or the answer broke)
    failed_before_answer: bool = False  # ...in an attempt, before any answer head
    rejected: bool = False  # ...because a header could not be carried (a client's)
    large_answer: bool = False  # a complete answer too large to hold, passed on unread
    stream: StreamOutcome | None = None
    usage: Usage | None = None
    usage_read: bool = False  # an answer was read for its usage (a 200)
    finish_reason: str | None = None
    response_model: str | None = None  # the model the answer named
    after: AfterCheck | None = None
    proxy_seconds: float = 0.0  # tailfloor's own time, the answer's part included
    overhead_seen: bool = False  # the answer was complete: proxy_seconds is whole
    status: int = 500
    client_gone: bool = False
    sent_recorded: bool = False  # the recorder has what was decided (``Recorder.sent``)
    after_recorded: bool = False  # ...and recovery's look at the answer
    # Spans are exported: the trace the attempts' traceparent joins (the client's, or one
    # tailfloor started), and the client's traceparent when it was valid.
    trace: TraceContext | None = None
    client_traceparent: str | None = None

    def __init__(self, request_id: str, chat: ChatRequest, started: float) -> None:
        self.request_id = request_id
        self.chat = chat
        self.started = started  # perf_counter() at the request's arrival
        self.at = time.time()  # the same moment, wall clock

    @property
    def verdict(self) -> str:
        if self.outgoing is not None:
            return self.outgoing.verdict
        return self.decision.verdict if self.decision is not None else "none"

"""Which traces are recorded: the specification's samplers, decided by tailfloor itself.

The decision is a pure function of the trace id and the client's context, so the request
path (which sends the upstream a ``traceparent`` whose sampled flag must say it) and the
telemetry thread (which makes the spans afterwards) reach the same one without sharing
anything. ``traceidratio`` compares the lower 64 bits of the trace id with
``ratio * 2**64``, as the specification's TraceIdRatioBased does, so every service sampling
at the same ratio keeps the same traces; ``parentbased_*`` follows the client's sampled
flag when it sent a context, and its root sampler otherwise. Pure: no I/O.
"""

from __future__ import annotations

from proxy.telemetry.config import Sampler
from proxy.telemetry.tracecontext import TraceContext

__all__ = ["TraceSampler"]


class TraceSampler:
    __slots__ = ("_always", "_bound", "_parent_based")

    def __init__(self, config: Sampler) -> None:
        self._parent_based = config.name.startswith("parentbased_")
        root = config.name.removeprefix("parentbased_")
        # None: by the ratio; True/False: always on/off.
        self._always: bool | None = {"always_on": True, "always_off": False}.get(root)
        self._bound = round(config.ratio * (1 << 64))

    @property
    def root(self) -> bool | None:
        """The decision for a trace without a client context, when it is the same for
        every trace id (always on, always off); None: by the trace id's ratio."""
        return self._always

    def sampled(self, trace_id: str, client: TraceContext | None) -> bool:
        """``trace_id``: 32 hex digits; ``client``: the context the client sent (None: none,
        or a malformed one)."""
        if self._parent_based and client is not None and client.parent_id is not None:
            return client.flags == "01"
        if self._always is not None:
            return self._always
        return int(trace_id[16:], 16) < self._bound

    def context(self, client: TraceContext | None) -> TraceContext:
        """The request's trace: the client's, or a new one, its sampled flag this
        sampler's decision (what the upstream is told)."""
        if client is None and self._always is not None:  # most requests: no call to make
            return TraceContext.new("01" if self._always else "00")
        trace = client or TraceContext.new()
        flags = "01" if self.sampled(trace.trace_id, client) else "00"
        return trace if flags == trace.flags else trace._replace(flags=flags)

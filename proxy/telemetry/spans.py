"""A finished request's report as encoded OTLP spans, with the ids the request path sent.

``plan_spans`` (attributes.py) says what the spans are; this turns them into protobuf
(protowire.py): the server span, the parent of the others, takes the client's context as its
parent (or none); each attempt's client span takes the id its ``traceparent`` gave the
upstream, and so does the summarizer's. The trace is recorded only when the sampler keeps it
(sampling.py): the same decision the request path made when it told the upstream.
Used from the telemetry thread only.
"""

from __future__ import annotations

import random

from proxy.report import RequestReport
from proxy.telemetry import protowire as wire
from proxy.telemetry.attributes import Label, Upstream, plan_spans
from proxy.telemetry.sampling import TraceSampler
from proxy.telemetry.tracecontext import parse_traceparent

__all__ = ["SpanEncoder"]

_KINDS = {"server": wire.SERVER, "client": wire.CLIENT}
# Span.flags: the W3C flags, and whether the parent was remote (the server span's is the
# client's, when it sent one; the others' is tailfloor's own server span).
_LOCAL = wire.FLAG_SAMPLED | wire.HAS_IS_REMOTE
_REMOTE = _LOCAL | wire.IS_REMOTE


class SpanEncoder:
    def __init__(self, upstream: Upstream, label: Label, agent_label: Label,
                 response_label: Label, sampler: TraceSampler) -> None:
        self._upstream = upstream
        self._label, self._agent_label = label, agent_label
        self._response_label = response_label
        self._sampler = sampler
        self._attributes = wire.AttributeCache(9)
        self._random = random.Random()  # ids need to be unique, not secret

    def _new_id(self, bits: int) -> int:
        while True:
            found = self._random.getrandbits(bits)
            if found:
                return found

    def encode(self, report: RequestReport) -> list[bytes]:
        """The report's spans, framed for a batch; none when the trace is not sampled."""
        client = parse_traceparent(report.traceparent)
        sent = next((a.traceparent for a in report.attempts if a.traceparent), None)
        if client is not None:
            trace_hex = client.trace_id
        elif sent is not None:
            trace_hex = sent[3:35]  # 00-<trace id>-<span id>-<flags>
        else:  # no attempt was made: a trace of its own
            trace_hex = f"{self._new_id(128):032x}"
        if not self._sampler.sampled(trace_hex, client):
            return []
        plans = plan_spans(report, self._upstream, self._label, self._agent_label,
                           _span_id, response_label=self._response_label)
        trace_id = bytes.fromhex(trace_hex)
        server_id = self._new_id(64).to_bytes(8, "big")
        parent = bytes.fromhex(client.parent_id) if client is not None \
            and client.parent_id is not None else None
        encode = self._attributes.encode
        out: list[bytes] = []
        for index, plan in enumerate(plans):
            if index == 0:
                span_id, parent_id, flags = server_id, parent, \
                    _REMOTE if parent is not None else _LOCAL
            else:
                span_id = plan.span_id.to_bytes(8, "big") if plan.span_id is not None \
                    else self._new_id(64).to_bytes(8, "big")
                parent_id, flags = server_id, _LOCAL
            out.append(wire.span(
                trace_id, span_id, parent_id, plan.name, _KINDS[plan.kind],
                start_ns=int(plan.start * 1e9), end_ns=int(plan.end * 1e9),
                attributes=encode(plan.attributes.items()), error=plan.error is not None,
                flags=flags))
        return out


def _span_id(traceparent: str) -> int:
    return int(traceparent[36:52], 16)

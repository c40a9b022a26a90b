"""A finished request's report as encoded OTLP spans, with the ids the request path sent.

What the spans are is attributes.py's: each span's fixed part (name, most attributes) is
made from its key and encoded once per distinct key (requests of one agent and model share
it), its numbers are encoded every time. The server span, the parent of the others, takes
the client's context as its parent (or none); each attempt's client span takes the id its
``traceparent`` gave the upstream, and so does the summarizer's. The trace is recorded only
when the sampler keeps it (sampling.py): the same decision the request path made when it
told the upstream. Used from the telemetry thread only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from struct import Struct

from proxy.report import Attempt, RequestReport
from proxy.telemetry import protowire as wire
from proxy.telemetry.attributes import (
    ATTEMPT_NUMBERS,
    SERVER_NUMBERS,
    Fixed,
    Key,
    Label,
    SpanPlan,
    Upstream,
    attempt_fixed,
    attempt_key,
    attempt_numbers,
    plan_spans,
    server_fixed,
    server_key,
    server_numbers,
)
from proxy.telemetry.content import content_attributes
from proxy.telemetry.sampling import TraceSampler
from proxy.telemetry.tracecontext import parse_traceparent

__all__ = ["SpanEncoder"]

# Span.flags: the W3C flags, and whether the parent was remote (the server span's is the
# client's, when it sent one; the others' is tailfloor's own server span).
_LOCAL = wire.FLAG_SAMPLED | wire.HAS_IS_REMOTE
_REMOTE = _LOCAL | wire.IS_REMOTE
_FIXED_KEPT = 4096  # distinct fixed parts kept per span kind; emptied when full
_F64 = Struct("<d")
_TRACE_ID, _SPAN_ID, _PARENT, _TIMES = wire.TRACE_ID, wire.SPAN_ID, wire.PARENT, wire.TIMES
_START_TAG, _END_TAG, _SPAN_TAG = wire.START_TAG, wire.END_TAG, wire.SPAN_TAG
_AFTER_START = Struct("<QBQ")  # _TIMES but the start's tag (a fixed part ends with it)
# encode's per key: the server span's Struct.pack, what comes before its trace id, its fixed
# part (and the start time's tag), its tail; the size of its fields but the numbers; the same
# of the attempt's span (the head apart: its numbers vary); whether usage is counted.
_Pair = tuple[Callable[..., bytes], bytes, bytes, bytes, int, Callable[..., bytes], bytes,
              bytes, int, bool]
_getrandbits = random.getrandbits  # ids need to be unique, not secret
# int() of a time in nanoseconds (never negative: floor is int()), without int's type call:
# a third of the cost, and encode makes three.
_floor = math.floor
_TAILS = {(error, flags): wire.span_tail(error, flags) for error in (False, True)
          for flags in (_LOCAL, _REMOTE)}


class SpanEncoder:
    def __init__(self, upstream: Upstream, label: Label, agent_label: Label,
                 response_label: Label, sampler: TraceSampler, *,
                 content_limit: int | None = None) -> None:
        """``content_limit``: capture what the model was sent (content.py), each attribute
        at most this long; None: never."""
        self._content_limit = content_limit
        self._upstream = upstream
        self._label, self._agent_label = label, agent_label
        self._response_label = response_label
        self._sampler = sampler
        self._attributes = wire.AttributeCache(9)
        self._server_numbers = wire.NumberKeys(9, SERVER_NUMBERS)
        self._attempt_numbers = wire.NumberKeys(9, ATTEMPT_NUMBERS)
        # key -> (span_fixed bytes, error)
        self._servers: dict[Key, tuple[bytes, bool]] = {}
        self._attempts: dict[Key, tuple[bytes, bool]] = {}
        # encode's key -> (server fixed, tail, size less its numbers; the same of
        # the attempt's span; whether the answer's usage is counted)
        self._pairs: dict[Key, _Pair] = {}
        self._root = sampler.root
        self._proxy_seconds = self._server_numbers.head(0)
        self._first_chunk = self._attempt_numbers.head(0)
        # Each token count below 128 with its key, whole (most counts of a small answer).
        count = self._attempt_numbers.count
        self._small = [[count(index, value) for value in range(128)]
                       for index in range(len(ATTEMPT_NUMBERS))]
        self._random = random.Random()  # ids need to be unique, not secret

    def _new_id(self, bits: int) -> int:
        while True:
            found = self._random.getrandbits(bits)
            if found:
                return found

    def _fixed(self, kept: dict[Key, tuple[bytes, bool]], key: Key, kind: int,
               made: Fixed) -> tuple[bytes, bool]:
        if len(kept) >= _FIXED_KEPT:
            kept.clear()
        found = kept[key] = self._encoded(kind, made)
        return found

    def _encoded(self, kind: int, made: Fixed) -> tuple[bytes, bool]:
        return (wire.span_fixed(made.name, kind, self._attributes.encode(
            made.attributes.items())), made.error is not None)

    def _general(self, report: RequestReport, model: str, agent: str) -> list[bytes]:
        """``encode`` for any report."""
        attempts = report.attempts
        client = parse_traceparent(report.traceparent) if report.traceparent else None
        sent = attempts[0].traceparent if attempts else None
        if client is not None:
            trace_hex = client.trace_id
        elif report.trace_id is not None:  # the one the upstream was told
            trace_hex = report.trace_id
        elif sent is not None:
            trace_hex = sent[3:35]  # 00-<trace id>-<span id>-<flags>
        else:  # no attempt was made: a trace of its own
            trace_hex = f"{self._new_id(128):032x}"
        if not self._sampler.sampled(trace_hex, client):
            return []
        prefix = wire.span_prefix(bytes.fromhex(trace_hex))
        server_id = self._new_id(64).to_bytes(8, "big")
        parent = wire.span_parent(bytes.fromhex(client.parent_id)) if client is not None \
            and client.parent_id is not None else b""
        under_server = wire.span_parent(server_id)
        at, seconds = report.at, report.seconds
        key = server_key(report, agent)
        fixed, error = self._servers.get(key) or self._fixed(
            self._servers, key, wire.SERVER, server_fixed(key))
        if report.restored or report.carried or report.added_tokens or report.tokens_removed:
            numbers = self._server_numbers.encode(server_numbers(report))
        else:  # most requests: tailfloor's own time alone (server_numbers' first)
            numbers = self._server_numbers.double(0, report.proxy_seconds)
        out = [wire.span(prefix, server_id, parent, fixed, int(at * 1e9),
                         int((at + seconds) * 1e9), numbers,
                         _TAILS[error, _REMOTE if parent else _LOCAL])]
        last = len(attempts) - 1
        for index, attempt in enumerate(attempts):
            start = at + attempt.started
            # The last attempt's answer is relayed to its end; an earlier one ended at its
            # error (as plan_spans says).
            end = at + seconds if index == last and attempt.error is None \
                else start + attempt.latency
            key = attempt_key(report, attempt, index == last, model, self._response_label)
            fixed, error = self._attempts.get(key) or self._fixed(
                self._attempts, key, wire.CLIENT, attempt_fixed(key, self._upstream))
            span_id = bytes.fromhex(attempt.traceparent[36:52]) if attempt.traceparent \
                else self._new_id(64).to_bytes(8, "big")
            numbers = self._attempt_numbers.encode(attempt_numbers(report, attempt, key))
            if index == last and self._content_limit is not None \
                    and report.messages is not None:  # what the last attempt sent
                numbers += b"".join(wire.span_attribute(name, value) for name, value in
                                    content_attributes(report.messages, self._content_limit))
            out.append(wire.span(
                prefix, span_id, under_server, fixed, int(start * 1e9),
                int(max(end, start) * 1e9), numbers, _TAILS[error, _LOCAL]))
        if report.summary is not None:  # rare: the general way
            plan = plan_spans(report, self._upstream, self._label, self._agent_label,
                              _span_id)[-1]
            out.append(self._whole(prefix, under_server, plan))
        return out

    def encode(self, report: RequestReport, model: str, agent: str) -> list[bytes]:
        """The report's spans, framed for a batch; none when the trace is not sampled.
        ``model``, ``agent``: the report's, labelled (the metrics need them too).

        Most requests (one attempt, no client context, no summary, no content) are made
        here with fewer calls: both spans' fixed parts under one key of the raw values
        they depend on, each span packed in one call of a Struct made for its key. The
        same bytes as ``_general`` (tests/telemetry/test_encoding.py holds both to
        plan_spans, and to each other)."""
        attempts = report.attempts
        if len(attempts) != 1 or report.traceparent is not None \
                or report.summary is not None \
                or (report.messages is not None and self._content_limit is not None):
            return self._general(report, model, agent)
        attempt = attempts[0]
        trace_hex = report.trace_id or (attempt.traceparent[3:35] if attempt.traceparent
                                        else f"{self._new_id(128):032x}")
        sampled = self._root
        if not (sampled if sampled is not None else self._sampler.sampled(trace_hex, None)):
            return []
        usage = report.usage
        key = (report.route, report.status, report.verdict, report.floor_kind, agent,
               report.floor_reason, report.method, report.carried_from, report.compaction,
               report.overflow, report.named_session, model, report.stream, attempt.number,
               attempt.status, attempt.compacted, attempt.error, attempt.broke,
               report.finish_reason,
               report.response_model, usage is not None)
        server_pack, server_pre, server_fixed_part, server_tail, server_size, \
            client_pack, client_fixed_part, client_tail, client_size, counted = \
            self._pairs.get(key) or self._pair(key, report, attempt, model, agent)
        trace_id = bytes.fromhex(trace_hex)
        server_id = (_getrandbits(64) or 1).to_bytes(8, "big")
        at = report.at
        start_ns = _floor(at * 1e9)
        end_ns = _floor((at + report.seconds) * 1e9)
        if report.restored or report.carried or report.added_tokens or report.tokens_removed:
            numbers = self._server_numbers.encode(server_numbers(report))
            size = server_size + len(numbers)
            server = b"".join((wire.span_head(size), _TRACE_ID, trace_id, _SPAN_ID, server_id,
                               server_fixed_part, _AFTER_START.pack(start_ns, _END_TAG, end_ns),
                               numbers, server_tail))
        else:  # tailfloor's own time alone: a size known in advance
            server = server_pack(server_pre, trace_id, _SPAN_ID, server_id, server_fixed_part,
                                 start_ns, _END_TAG, end_ns, self._proxy_seconds,
                                 report.proxy_seconds, server_tail)
        started = at + attempt.started
        attempt_start = _floor(started * 1e9)
        attempt_end = end_ns if attempt.error is None \
            else _floor((started + attempt.latency) * 1e9)
        traceparent = attempt.traceparent
        span_id = bytes.fromhex(traceparent[36:52]) if traceparent \
            else self._new_id(64).to_bytes(8, "big")
        first = attempt.first_chunk
        numbers = self._first_chunk + _F64.pack(first - attempt.started) \
            if first is not None else b""
        if counted and usage is not None:  # attempt_numbers' counts, in their order
            small, count = self._small, self._attempt_numbers.count
            value = usage.prompt_tokens
            if value is not None:
                numbers += small[1][value] if 0 <= value < 128 else count(1, value)
            value = usage.completion_tokens
            if value is not None:
                numbers += small[2][value] if 0 <= value < 128 else count(2, value)
            value = usage.cached_tokens
            if value is not None:
                numbers += small[3][value] if 0 <= value < 128 else count(3, value)
            value = usage.reasoning_tokens
            if value is not None:
                numbers += small[4][value] if 0 <= value < 128 else count(4, value)
        size = client_size + len(numbers)
        client = b"".join((
            bytes((_SPAN_TAG, size & 0x7F | 0x80, size >> 7)) if 127 < size < 16384
            else wire.span_head(size), client_pack(
                _TRACE_ID, trace_id, _SPAN_ID, span_id, _PARENT, server_id,
                client_fixed_part, attempt_start, _END_TAG,
                attempt_end if attempt_end > attempt_start else attempt_start),
            numbers, client_tail))
        return [server, client]

    def _pair(self, key: Key, report: RequestReport, attempt: Attempt, model: str,
              agent: str) -> _Pair:
        """What ``encode``'s two spans are but their ids, times and numbers, kept under
        ``key``."""
        server, server_error = self._encoded(wire.SERVER,
                                             server_fixed(server_key(report, agent)))
        made = attempt_key(report, attempt, True, model, self._response_label)
        client, client_error = self._encoded(wire.CLIENT, attempt_fixed(made, self._upstream))
        server_tail, client_tail = _TAILS[server_error, _LOCAL], _TAILS[client_error, _LOCAL]
        if len(self._pairs) >= _FIXED_KEPT:
            self._pairs.clear()
        # The ids and the times (and the parent, for the client span) around the fixed
        # parts; the start time's tag joins the fixed part.
        around = len(_TRACE_ID) + 16 + len(_SPAN_ID) + 8 + _TIMES.size
        server_size = around + len(server) + len(server_tail)
        numbers = len(self._proxy_seconds) + _F64.size
        pre = wire.span_head(server_size + numbers) + _TRACE_ID
        server_part, client_part = server + bytes((_START_TAG,)), client + bytes((_START_TAG,))
        found = self._pairs[key] = (
            Struct(f"<{len(pre)}s16s{len(_SPAN_ID)}s8s{len(server_part)}sQBQ"
                   f"{len(self._proxy_seconds)}sd{len(server_tail)}s").pack,
            pre, server_part, server_tail, server_size,
            Struct(f"<{len(_TRACE_ID)}s16s{len(_SPAN_ID)}s8s{len(_PARENT)}s8s"
                   f"{len(client_part)}sQBQ").pack,
            client_part, client_tail, around + len(_PARENT) + 8 + len(client) + len(client_tail),
            made[-1])
        return found

    def _whole(self, prefix: bytes, parent: bytes, plan: SpanPlan) -> bytes:
        span_id = plan.span_id if plan.span_id is not None else self._new_id(64)
        return wire.span(
            prefix, span_id.to_bytes(8, "big"), parent,
            wire.span_fixed(plan.name, wire.CLIENT, b""), int(plan.start * 1e9),
            int(plan.end * 1e9), self._attributes.encode(plan.attributes.items()),
            _TAILS[plan.error is not None, _LOCAL])


def _span_id(traceparent: str) -> int:
    return int(traceparent[36:52], 16)

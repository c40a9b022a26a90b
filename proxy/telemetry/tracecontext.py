"""W3C trace context (``traceparent``): the client's, and the one each upstream attempt
sends, whose parent is that attempt's span.

The ids are made on the request path, before the spans exist: the spans are built after the
request from its report (``proxy/telemetry/spans.py``) with these very ids, so the upstream's
own spans join tailfloor's. A malformed ``traceparent`` starts a new trace, never an error.
Pure: no I/O, no OpenTelemetry import.
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple

__all__ = ["TraceContext", "ids_of", "new_span_id", "parse_traceparent"]

# version 00 exactly as the specification spells it; a later version is read by its first
# four fields, as the specification asks of a version it does not know.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# Ids must be unique, not secret (the specification asks for randomness, not for a
# cryptographic source): the module's generator, one C call, not os.urandom per id.
_getrandbits = random.getrandbits


class TraceContext(NamedTuple):
    trace_id: str  # 32 lowercase hex digits
    parent_id: str | None  # the client's span, when it sent one
    flags: str  # two hex digits; 01: sampled

    @classmethod
    def new(cls, flags: str = "01") -> TraceContext:
        # to_bytes().hex(), not a format spec: an int formatted to a width takes the slow
        # path, twice as long.
        return _make(cls, ((_getrandbits(128) or _nonzero(128)).to_bytes(16, "big").hex(),
                           None, flags))

    def traceparent(self, span_id: str) -> str:
        """The header an upstream call made in span ``span_id`` carries."""
        return f"00-{self.trace_id}-{span_id}-{self.flags}"

    def child(self) -> str:
        """The header of an upstream call made in a new span of this trace."""
        span_id = (_getrandbits(64) or _nonzero(64)).to_bytes(8, "big").hex()
        return f"00-{self.trace_id}-{span_id}-{self.flags}"


def new_span_id() -> str:
    return (_getrandbits(64) or _nonzero(64)).to_bytes(8, "big").hex()


def parse_traceparent(value: str | None) -> TraceContext | None:
    """The client's context; None when absent or malformed."""
    if not value:
        return None
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return None
    version, trace_id, parent_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} \
            or set(parent_id) == {"0"}:
        return None
    return TraceContext(trace_id, parent_id, f"{int(flags, 16) & 1:02x}")


def ids_of(traceparent: str) -> tuple[int, int]:
    """(trace id, span id) of a traceparent this module made."""
    _, trace_id, span_id, _ = traceparent.split("-", 3)
    return int(trace_id, 16), int(span_id, 16)


def _make(cls: type[TraceContext], fields: tuple[str, str | None, str]) -> TraceContext:
    """A TraceContext from its three fields, without the named tuple's own constructor (a
    Python function around this one call)."""
    return tuple.__new__(cls, fields)


def _nonzero(bits: int) -> int:
    while True:
        value = _getrandbits(bits)
        if value:
            return value

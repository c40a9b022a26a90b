"""OTLP messages in protobuf's wire format, written by hand from the specification.

Only what tailfloor exports: KeyValue/AnyValue (string, bool, int, double, array of
strings), Span, and the Sum/Histogram/Gauge metric messages, each inside its
Resource*/Scope*/Export*ServiceRequest (field numbers from opentelemetry-proto's
common.proto, resource.proto, trace.proto, metrics.proto and the collector's service
protos). The general protobuf library builds a message object per field, which costs more
than the rest of a request; here a message is a list of ``bytes`` joined once, and what is
the same in every message (the tags, a constant attribute's key) is encoded once.

A field is written as its tag (field number << 3 | wire type) then its value: a varint
(type 0), 8 little-endian bytes (type 1: fixed64, double), a length and bytes (type 2:
strings, bytes, sub-messages, packed repeated numbers) or 4 little-endian bytes (type 5).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from struct import Struct, pack

__all__ = ["CLIENT", "CUMULATIVE", "DELTA", "END_TAG", "PARENT", "SERVER", "SPAN_ID", "SPAN_TAG",
           "START_TAG", "TIMES", "TRACE_ID", "AttributeCache", "NumberKeys", "Value",
           "any_value", "delimited", "double", "export_metrics", "export_traces", "fixed64",
           "framed_span", "gauge", "histogram", "histogram_point", "key_value", "metric",
           "number_point", "resource", "scope", "span", "span_fixed", "span_head", "span_parent",
           "span_prefix", "span_tail", "sum_", "tag", "varint"]

Value = str | bool | int | float | tuple[str, ...]

SERVER, CLIENT = 2, 3  # Span.SpanKind
DELTA, CUMULATIVE = 1, 2  # AggregationTemporality
_LENGTH, _FIXED64, _VARINT, _FIXED32 = 2, 1, 0, 5
_U64 = Struct("<Q")
_F64 = Struct("<d")
_U32 = Struct("<I")
_MASK64 = (1 << 64) - 1
# Lengths and small numbers are nearly always below 128: their one byte, looked up.
_ONE = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """Base 128, least significant group first; a negative int64 as its two's complement
    (ten bytes), as protobuf writes int64."""
    if 0 <= value < 128:
        return _ONE[value]
    if 0 < value < 16384:  # a span's length, a token count: two bytes, or three
        return bytes((value & 0x7F | 0x80, value >> 7))
    if 0 < value < 2097152:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def delimited(field_tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a sub-message) with its tag."""
    size = len(payload)
    if size < 128:
        return field_tag + _ONE[size] + payload
    if size < 16384:
        return field_tag + bytes((size & 0x7F | 0x80, size >> 7)) + payload
    return field_tag + varint(size) + payload


def fixed64(field_tag: bytes, value: int) -> bytes:
    return field_tag + _U64.pack(value & _MASK64)


def double(field_tag: bytes, value: float) -> bytes:
    return field_tag + _F64.pack(value)


# -- common.proto: AnyValue { string 1, bool 2, int 3, double 4, array 5 },
#    ArrayValue { values 1 }, KeyValue { key 1, value 2 }

_STRING, _BOOL, _INT, _DOUBLE, _ARRAY = (tag(n, w) for n, w in (
    (1, _LENGTH), (2, _VARINT), (3, _VARINT), (4, _FIXED64), (5, _LENGTH)))
_TRUE, _FALSE = _BOOL + b"\x01", _BOOL + b"\x00"
_KEY, _VALUE, _VALUES = tag(1, _LENGTH), tag(2, _LENGTH), tag(1, _LENGTH)


def any_value(value: Value) -> bytes:
    """The AnyValue message of ``value`` (bool before int: a bool is an int in Python)."""
    kind = value.__class__
    if kind is str:
        return delimited(_STRING, _utf8(value))  # type: ignore[arg-type]
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is int:
        return _INT + varint(value)  # type: ignore[arg-type]
    if kind is float:
        return _DOUBLE + _F64.pack(value)
    if kind is tuple:
        return delimited(_ARRAY, b"".join(
            delimited(_VALUES, delimited(_STRING, _utf8(item)))
            for item in value))  # type: ignore[union-attr]
    raise TypeError(f"no AnyValue for {kind.__name__}")


def key_value(key: str, value: Value) -> bytes:
    """The KeyValue message (unframed)."""
    return delimited(_KEY, key.encode()) + delimited(_VALUE, any_value(value))


def span_attribute(key: str, value: str) -> bytes:
    """One Span attribute (field 9), encoded each time: for a value no other span shares
    (a request's content), which no cache should keep."""
    return delimited(_SPAN_ATTRIBUTE, key_value(key, value))


_SPAN_ATTRIBUTE = tag(9, _LENGTH)


class AttributeCache:
    """Attributes as the repeated KeyValue field ``field`` of one message kind. A string,
    bool or array pair is encoded once (a request's names, models and verdicts repeat from
    one request to the next; one dict per type, True == 1 as dict keys); a number is encoded
    each time (counts and seconds rarely repeat) behind its key, itself encoded once.
    Bounded: a dict is emptied when full (a model name a client made up never grows it
    forever)."""

    __slots__ = ("_by_type", "_field", "_keys", "_limit")

    def __init__(self, field: int, limit: int = 4096) -> None:
        self._field = tag(field, _LENGTH)
        self._limit = limit
        self._by_type: dict[type, dict[tuple[str, Value], bytes]] = {
            str: {}, bool: {}, tuple: {}}
        self._keys: dict[str, bytes] = {}  # a number's key, with the value's tag

    def encode(self, pairs: Iterable[tuple[str, Value]]) -> bytes:
        by_type = self._by_type
        out: list[bytes] = []
        for pair in pairs:
            key, value = pair
            found = by_type.get(value.__class__)
            if found is not None:
                framed = found.get(pair)
                if framed is None:
                    if len(found) >= self._limit:
                        found.clear()
                    framed = found[pair] = delimited(self._field, key_value(key, value))
                out.append(framed)
                continue
            head = self._keys.get(key)
            if head is None:
                head = self._keys[key] = delimited(_KEY, key.encode()) + _VALUE
            number = _INT + varint(value) if value.__class__ is int \
                else _DOUBLE + _F64.pack(value)
            # An int's or double's AnyValue is at most 11 bytes: its length is one byte.
            out.append(delimited(self._field, head + _ONE[len(number)] + number))
        return b"".join(out)


class NumberKeys:
    """Numbers under keys known in advance, as the repeated KeyValue field ``field``: each
    key's KeyValue up to the number itself is encoded once, for every length an int's
    varint or a double takes, so a number costs its own bytes and one concatenation.
    ``encode`` takes the values in the keys' order, None for one left out."""

    __slots__ = ("_heads",)

    def __init__(self, field: int, keys: Sequence[str]) -> None:
        framed = tag(field, _LENGTH)

        def head(key_part: bytes, value_tag: bytes, size: int) -> bytes:
            # The KeyValue's length counts the key, the AnyValue's tag, length and value.
            kv = len(key_part) + 2 + 1 + size
            return framed + varint(kv) + key_part + _VALUE + _ONE[1 + size] + value_tag

        self._heads: list[tuple[bytes, ...]] = []
        for key in keys:
            part = delimited(_KEY, key.encode())
            # [0]: a double; [n]: an int whose varint takes n bytes (1 to 10).
            self._heads.append((head(part, _DOUBLE, 8),
                                *(head(part, _INT, n) for n in range(1, 11))))

    def head(self, index: int) -> bytes:
        """What comes before a double of key ``index``: its KeyValue up to the 8 bytes."""
        return self._heads[index][0]

    def count(self, index: int, value: int) -> bytes:
        """The int ``value`` of key ``index`` alone (a count: one or two bytes, mostly)."""
        heads = self._heads[index]
        if 0 <= value < 128:
            return heads[1] + _ONE[value]
        if 0 < value < 16384:
            return heads[2] + bytes((value & 0x7F | 0x80, value >> 7))
        number = varint(value)
        return heads[len(number)] + number

    def double(self, index: int, value: float) -> bytes:
        """The number of key ``index`` alone, a double."""
        return self._heads[index][0] + _F64.pack(value)

    def encode(self, values: Sequence[float | None]) -> bytes:
        out: list[bytes] = []
        for heads, value in zip(self._heads, values, strict=False):  # as many: the caller's
            if value is None:
                continue
            if value.__class__ is int:
                if 0 <= value < 128:
                    out.append(heads[1] + _ONE[value])
                elif 0 < value < 16384:
                    out.append(heads[2] + bytes((value & 0x7F | 0x80, value >> 7)))
                else:
                    number = varint(value)
                    out.append(heads[len(number)] + number)
            else:
                out.append(heads[0] + _F64.pack(value))
        return b"".join(out)


# -- resource.proto: Resource { attributes 1 }; common.proto: InstrumentationScope
#    { name 1, version 2 }

def resource(pairs: Iterable[tuple[str, Value]]) -> bytes:
    return AttributeCache(1).encode(pairs)


def scope(name: str, version: str = "") -> bytes:
    out = delimited(tag(1, _LENGTH), name.encode())
    return out + delimited(tag(2, _LENGTH), version.encode()) if version else out


# -- trace.proto: Span { trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5,
#    kind 6, start_time_unix_nano 7, end_time_unix_nano 8, attributes 9, status 15,
#    flags 16 }, Status { message 2, code 3 }; ScopeSpans { scope 1, spans 2 };
#    ResourceSpans { resource 1, scope_spans 2 }; ExportTraceServiceRequest
#    { resource_spans 1 }

TRACE_ID, SPAN_ID = tag(1, _LENGTH) + b"\x10", tag(2, _LENGTH) + b"\x08"
_TRACE_STATE, PARENT = tag(3, _LENGTH), tag(4, _LENGTH) + b"\x08"
_NAME, _KIND = tag(5, _LENGTH), tag(6, _VARINT)
# Both times in one pack: their tags are one byte each (fields 7 and 8, fixed64).
START_TAG, END_TAG = 7 << 3 | _FIXED64, 8 << 3 | _FIXED64
TIMES = Struct("<BQBQ")
_STATUS_ERROR = delimited(tag(15, _LENGTH), tag(3, _VARINT) + b"\x02")  # STATUS_CODE_ERROR
_FLAGS = tag(16, _FIXED32)
_SPAN = tag(2, _LENGTH)  # ScopeSpans.spans: a span framed for its batch
SPAN_TAG = _SPAN[0]
FLAG_SAMPLED, HAS_IS_REMOTE, IS_REMOTE = 0x1, 0x100, 0x200  # Span.flags (SpanFlags)


def span_fixed(name: str, kind: int, attributes: bytes) -> bytes:
    """A span's name, kind and ``attributes`` (from an ``AttributeCache(9)``): the part
    many spans share, encoded once. Protobuf reads fields in any order, and a repeated
    field's items wherever they are, so this sits in a span as one piece."""
    return delimited(_NAME, _utf8(name)) + _KIND + _ONE[kind] + attributes


def span_prefix(trace_id: bytes) -> bytes:
    """What every span of trace ``trace_id`` begins with: its trace id and the span id's
    tag (the 8-byte span id follows)."""
    return TRACE_ID + trace_id + SPAN_ID


def span_parent(parent_span_id: bytes | None, trace_state: str = "") -> bytes:
    """The parent_span_id (and trace_state) fields; empty for a root span."""
    found = PARENT + parent_span_id if parent_span_id else b""
    return found + delimited(_TRACE_STATE, trace_state.encode()) if trace_state else found


def span_tail(error: bool, flags: int) -> bytes:
    """The status (error, or unset) and flags fields."""
    return (_STATUS_ERROR if error else b"") + _FLAGS + _U32.pack(flags)


def span(prefix: bytes, span_id: bytes, parent: bytes, fixed: bytes,  # noqa: PLR0917
         start_ns: int, end_ns: int, attributes: bytes, tail: bytes) -> bytes:
    """One Span framed as ScopeSpans.spans: batches join these as they are. ``prefix``,
    ``parent``, ``tail``: from ``span_prefix``, ``span_parent``, ``span_tail``, shared by
    many spans; ``fixed``: from ``span_fixed``; ``attributes``: more of them (from an
    ``AttributeCache(9)`` or ``NumberKeys(9, ...)``). Positional: called for every span,
    where passing by keyword costs."""
    return framed_span(b"".join((prefix, span_id, parent, fixed, TIMES.pack(
        START_TAG, start_ns, END_TAG, end_ns), attributes, tail)))


def framed_span(body: bytes) -> bytes:
    """A Span's fields as one item of ScopeSpans.spans: its tag and length first."""
    return span_head(len(body)) + body


def span_head(size: int) -> bytes:
    """What comes before ``size`` bytes of a Span's fields in ScopeSpans.spans."""
    if size < 128:
        return _SPAN + _ONE[size]
    if size < 16384:
        return bytes((SPAN_TAG, size & 0x7F | 0x80, size >> 7))
    return _SPAN + varint(size)


def export_traces(resource_attributes: bytes, scope_message: bytes,
                  spans: Sequence[bytes]) -> bytes:
    """The ExportTraceServiceRequest of framed ``spans`` (one resource, one scope): the
    enclosing lengths summed first, so the batch is copied once, not once per level."""
    scope = delimited(_FIELD_1, scope_message)
    scope_spans = len(scope) + sum(map(len, spans))
    middle = delimited(_FIELD_1, resource_attributes) + _FIELD_2 + varint(scope_spans)
    return b"".join((_FIELD_1, varint(len(middle) + scope_spans), middle, scope, *spans))


_FIELD_1, _FIELD_2 = tag(1, _LENGTH), tag(2, _LENGTH)


# -- metrics.proto: Metric { name 1, description 2, unit 3, gauge 5, sum 7, histogram 9 };
#    Sum { data_points 1, aggregation_temporality 2, is_monotonic 3 }; Gauge
#    { data_points 1 }; Histogram { data_points 1, aggregation_temporality 2 };
#    NumberDataPoint { start_time_unix_nano 2, time_unix_nano 3, as_double 4, as_int 6
#    (sfixed64), attributes 7 }; HistogramDataPoint { start_time_unix_nano 2,
#    time_unix_nano 3, count 4, sum 5, bucket_counts 6 (packed fixed64), explicit_bounds 7
#    (packed double), attributes 9, min 11, max 12 }; ScopeMetrics { scope 1, metrics 2 };
#    ResourceMetrics { resource 1, scope_metrics 2 }; ExportMetricsServiceRequest
#    { resource_metrics 1 }

_POINT = tag(1, _LENGTH)
_P_START, _P_TIME = tag(2, _FIXED64), tag(3, _FIXED64)
_AS_DOUBLE, _AS_INT = tag(4, _FIXED64), tag(6, _FIXED64)
_H_COUNT, _H_SUM, _H_BUCKETS, _H_BOUNDS = (tag(4, _FIXED64), tag(5, _FIXED64),
                                           tag(6, _LENGTH), tag(7, _LENGTH))
_H_MIN, _H_MAX = tag(11, _FIXED64), tag(12, _FIXED64)


def number_point(attributes: bytes, start_ns: int, time_ns: int, value: float) -> bytes:
    """A NumberDataPoint framed for its Sum or Gauge; ``attributes`` from an
    ``AttributeCache(7)``. An int is as_int, anything else as_double."""
    number = fixed64(_AS_INT, value) if isinstance(value, int) \
        else double(_AS_DOUBLE, value)
    return delimited(_POINT, b"".join((
        fixed64(_P_START, start_ns), fixed64(_P_TIME, time_ns), number, attributes)))


def histogram_point(attributes: bytes, start_ns: int, time_ns: int, counts: Sequence[int],
                    bounds: Sequence[float], *, total: float, minimum: float,
                    maximum: float) -> bytes:
    """A HistogramDataPoint framed for its Histogram: ``counts`` has one more bucket than
    ``bounds``; ``attributes`` from an ``AttributeCache(9)``."""
    packed_counts = pack(f"<{len(counts)}Q", *counts)  # one call, not one a bucket
    packed_bounds = pack(f"<{len(bounds)}d", *bounds)
    return delimited(_POINT, b"".join((
        fixed64(_P_START, start_ns), fixed64(_P_TIME, time_ns),
        fixed64(_H_COUNT, sum(counts)), double(_H_SUM, total),
        delimited(_H_BUCKETS, packed_counts), delimited(_H_BOUNDS, packed_bounds),
        attributes, double(_H_MIN, minimum), double(_H_MAX, maximum))))


_TEMPORALITY, _MONOTONIC = tag(2, _VARINT), tag(3, _VARINT)


def sum_(points: Sequence[bytes], temporality: int, monotonic: bool) -> bytes:
    return delimited(tag(7, _LENGTH), b"".join(points) + _TEMPORALITY + _ONE[temporality]
                     + _MONOTONIC + _ONE[int(monotonic)])


def gauge(points: Sequence[bytes]) -> bytes:
    return delimited(tag(5, _LENGTH), b"".join(points))


def histogram(points: Sequence[bytes], temporality: int) -> bytes:
    return delimited(tag(9, _LENGTH), b"".join(points) + _TEMPORALITY + _ONE[temporality])


def metric(name: str, description: str, unit: str, data: bytes) -> bytes:
    """A Metric framed as ScopeMetrics.metrics; ``data`` from ``sum_``, ``gauge`` or
    ``histogram``."""
    return delimited(tag(2, _LENGTH), b"".join((
        delimited(tag(1, _LENGTH), name.encode()),
        delimited(tag(2, _LENGTH), description.encode()),
        delimited(tag(3, _LENGTH), unit.encode()), data)))


def export_metrics(resource_attributes: bytes, scope_message: bytes,
                   metrics: Sequence[bytes]) -> bytes:
    """The ExportMetricsServiceRequest of framed ``metrics`` (one resource, one scope)."""
    scope_metrics = delimited(tag(1, _LENGTH), scope_message) + b"".join(metrics)
    resource_metrics = delimited(tag(1, _LENGTH), resource_attributes) \
        + delimited(tag(2, _LENGTH), scope_metrics)
    return delimited(tag(1, _LENGTH), resource_metrics)


def _utf8(text: str) -> bytes:
    """Protobuf strings are UTF-8: a lone surrogate (a header or file name's undecodable
    byte, as aiohttp and the file system hand it over) becomes "?", not an exception that
    loses the request's spans."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode(errors="replace")

"""protowire's bytes, decoded by opentelemetry-proto (protobuf's own parser): every field
type tailfloor writes, compared with the values set here."""

from __future__ import annotations

import math
import struct

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from proxy.telemetry import protowire as wire
from tests.otlp_receiver import attributes

TRACE = bytes(range(1, 17))
SPAN, PARENT = bytes(range(20, 28)), bytes(range(40, 48))
LONG = "é" * 200  # 400 bytes: a two-byte length
HUGE = "x" * 20_000  # a three-byte length


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**31, 2**63 - 1,
                                   -1, -(2**63)])
def test_ints_and_varints(value: int) -> None:
    decoded = AnyValue.FromString(wire.any_value(value))
    assert decoded.WhichOneof("value") == "int_value" and decoded.int_value == value


@pytest.mark.parametrize("value", ["", "plain", LONG, HUGE, True, False, 0.0, -2.5,
                                   1e300, ("a", LONG, ""), ()])
def test_any_values(value: object) -> None:
    decoded = AnyValue.FromString(wire.any_value(value))  # type: ignore[arg-type]
    if isinstance(value, tuple):
        assert decoded.WhichOneof("value") == "array_value"
        assert tuple(v.string_value for v in decoded.array_value.values) == value
    elif isinstance(value, bool):
        assert decoded.WhichOneof("value") == "bool_value" and decoded.bool_value is value
    elif isinstance(value, float):
        assert decoded.WhichOneof("value") == "double_value" and decoded.double_value == value
    else:
        assert decoded.WhichOneof("value") == "string_value" and decoded.string_value == value
    pair = KeyValue.FromString(wire.key_value("k.ey", value))  # type: ignore[arg-type]
    assert pair.key == "k.ey" and pair.value == decoded


def test_attribute_cache_and_number_keys() -> None:
    pairs = [("s", "x"), ("long", LONG), ("b", True), ("b2", False), ("i", 1), ("n", -7),
             ("big", 2**40), ("f", 0.125), ("arr", ("p", "q"))]
    want = dict(pairs)
    cache = wire.AttributeCache(9, limit=2)  # emptied over and over: the same bytes
    first = cache.encode(pairs)
    assert cache.encode(pairs) == first
    # True == 1 as dict keys: a bool and an int under one key stay what they were.
    mixed = cache.encode([("k", True), ("k", 1), ("k", 1.0)])
    assert [a.value.WhichOneof("value") for a in Span.FromString(mixed).attributes] \
        == ["bool_value", "int_value", "double_value"]
    assert attributes(Span.FromString(first).attributes) == want
    keys = ("a.seconds", "b.count", "c.count", "d.count", "e.count", "f.count")
    values = (0.25, None, 5, 300, 2**35, -3)
    numbers = wire.NumberKeys(9, keys).encode(values)
    assert attributes(Span.FromString(numbers).attributes) == {
        key: value for key, value in zip(keys, values, strict=True) if value is not None}
    counts = wire.NumberKeys(9, keys)
    for value in (0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1, -1, -3, -(2**63)):
        alone = counts.count(2, value)  # as decoded by protobuf itself
        assert attributes(Span.FromString(alone).attributes) == {"c.count": value}


def test_a_span_and_its_request() -> None:
    fixed = wire.span_fixed("chat model-x", wire.CLIENT,
                            wire.AttributeCache(9).encode([("gen_ai.request.model", LONG)]))
    start, end = 1_700_000_000_123_456_789, 1_700_000_001_987_654_321
    prefix = wire.span_prefix(TRACE)
    framed = wire.span(prefix, SPAN, wire.span_parent(PARENT, "vendor=1"), fixed, start, end,
                       wire.NumberKeys(9, ("n",)).encode((42,)), wire.span_tail(
                           True, wire.FLAG_SAMPLED | wire.HAS_IS_REMOTE | wire.IS_REMOTE))
    plain = wire.span(prefix, PARENT, wire.span_parent(None),
                      wire.span_fixed(HUGE, wire.SERVER, b""), 0, 1, b"",
                      wire.span_tail(False, wire.FLAG_SAMPLED | wire.HAS_IS_REMOTE))
    request = ExportTraceServiceRequest.FromString(wire.export_traces(
        wire.resource([("service.name", "svc"), ("deployment.environment", "prod")]),
        wire.scope("tailfloor", "9.9"), [framed, plain]))
    (resource_spans,) = request.resource_spans
    assert attributes(resource_spans.resource.attributes) == {
        "service.name": "svc", "deployment.environment": "prod"}
    (scope_spans,) = resource_spans.scope_spans
    assert (scope_spans.scope.name, scope_spans.scope.version) == ("tailfloor", "9.9")
    span, other = scope_spans.spans
    assert span.trace_id == TRACE and span.span_id == SPAN and span.parent_span_id == PARENT
    assert span.trace_state == "vendor=1"
    assert span.name == "chat model-x" and span.kind == Span.SPAN_KIND_CLIENT
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (start, end)
    assert attributes(span.attributes) == {"gen_ai.request.model": LONG, "n": 42}
    assert span.status.code == Status.STATUS_CODE_ERROR
    assert span.flags == 0x301
    assert other.name == HUGE and other.kind == Span.SPAN_KIND_SERVER
    assert not other.parent_span_id and other.status.code == Status.STATUS_CODE_UNSET
    assert other.flags == 0x101 and not other.trace_state


def test_metrics_messages() -> None:
    numbers = wire.AttributeCache(7)
    points = [wire.number_point(numbers.encode([("kind", "a"), ("port", 443)]), 10, 20, 7),
              wire.number_point(b"", 10, 20, 0.5), wire.number_point(b"", 10, 20, -3)]
    bounds = (0.1, 1.0, 10.0)
    histogram = wire.histogram_point(wire.AttributeCache(9).encode([("e", "x")]), 11, 21,
                                     [1, 0, 2, 2**40], bounds, total=12.5, minimum=0.05,
                                     maximum=math.inf)
    body = wire.export_metrics(wire.resource([("service.name", "svc")]), wire.scope("s"), [
        wire.metric("counter", "what it counts", "{token}",
                    wire.sum_(points, wire.CUMULATIVE, monotonic=True)),
        wire.metric("delta", "", "USD", wire.sum_(points[1:2], wire.DELTA, monotonic=False)),
        wire.metric("seconds", "how long", "s", wire.histogram([histogram], wire.DELTA)),
        wire.metric("level", "", "1", wire.gauge(points[:1]))])
    request = ExportMetricsServiceRequest.FromString(body)
    (resource_metrics,) = request.resource_metrics
    assert attributes(resource_metrics.resource.attributes) == {"service.name": "svc"}
    (scope_metrics,) = resource_metrics.scope_metrics
    assert scope_metrics.scope.name == "s" and not scope_metrics.scope.version
    counter, delta, seconds, level = scope_metrics.metrics
    assert (counter.name, counter.description, counter.unit) == (
        "counter", "what it counts", "{token}")
    assert counter.WhichOneof("data") == "sum"
    assert counter.sum.aggregation_temporality == \
        AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert counter.sum.is_monotonic
    first, second, third = counter.sum.data_points
    assert attributes(first.attributes) == {"kind": "a", "port": 443}
    assert (first.start_time_unix_nano, first.time_unix_nano) == (10, 20)
    assert first.WhichOneof("value") == "as_int" and first.as_int == 7
    assert second.WhichOneof("value") == "as_double" and second.as_double == 0.5
    assert third.as_int == -3
    assert delta.sum.aggregation_temporality == \
        AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    assert not delta.sum.is_monotonic
    assert seconds.WhichOneof("data") == "histogram"
    assert seconds.histogram.aggregation_temporality == \
        AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    (point,) = seconds.histogram.data_points
    assert list(point.bucket_counts) == [1, 0, 2, 2**40]
    assert list(point.explicit_bounds) == list(bounds)
    assert point.count == 3 + 2**40 and point.sum == 12.5
    assert point.min == 0.05 and point.max == math.inf
    assert (point.start_time_unix_nano, point.time_unix_nano) == (11, 21)
    assert attributes(point.attributes) == {"e": "x"}
    assert level.WhichOneof("data") == "gauge" and level.gauge.data_points[0].as_int == 7


def test_the_primitives_by_hand() -> None:
    """The specification's own examples: 150 is 96 01, field 1 varint 150 is 08 96 01."""
    assert wire.varint(150) == b"\x96\x01"
    assert wire.tag(1, 0) + wire.varint(150) == bytes.fromhex("089601")
    assert wire.delimited(wire.tag(2, 2), b"testing") == bytes.fromhex("120774657374696e67")
    assert wire.fixed64(b"\x09", 1) == b"\x09" + struct.pack("<Q", 1)
    assert wire.double(b"\x21", 1.5) == b"\x21" + struct.pack("<d", 1.5)
    assert wire.varint(-1) == b"\xff" * 9 + b"\x01"


def test_a_lone_surrogate_is_encoded_not_raised() -> None:
    # aiohttp hands an undecodable header byte over as a lone surrogate (surrogateescape).
    found = AnyValue.FromString(wire.any_value("ab\udcffcd"))
    assert found.string_value == "ab?cd"

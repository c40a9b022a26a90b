"""The OTLP metric aggregates across exports: delta points say what came since the last
export, cumulative ones keep adding, whatever the instruments keep between requests."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from proxy.policy.prices import PriceList
from proxy.report import Attempt, RequestReport
from proxy.telemetry import protowire as wire
from proxy.telemetry.attributes import Upstream
from proxy.telemetry.meters import _COUNTERS, _DURATION, _FIRST_CHUNK, Instruments
from proxy.wire.usage import Usage
from tests.otlp_receiver import attributes

UPSTREAM = Upstream.of("http://127.0.0.1:8080")


def report(model: str = "m", prompt: int = 10, stream: bool = False) -> RequestReport:
    return RequestReport(
        "r", 1.0, "chat_completions", model, "pi", stream, 200, "none; reason=x", 0.5, 0.01,
        floor_kind="none", attempts=(Attempt(0, 200, 0.1, 0.2,
                                             first_chunk=0.3 if stream else None),),
        usage=Usage(prompt, 2, prompt + 2, 1, None))


def exported(instruments: Instruments, now: int) -> dict[str, dict[str, Any]]:
    """Each metric's points by their model: a sum's value, a histogram's count."""
    body = wire.export_metrics(b"", wire.scope("t"), instruments.collect(now))
    found: dict[str, dict[str, Any]] = {}
    for metric in ExportMetricsServiceRequest.FromString(body).resource_metrics[0] \
            .scope_metrics[0].metrics:
        kind = metric.WhichOneof("data")
        for point in getattr(metric, kind).data_points:
            model = attributes(point.attributes).get("gen_ai.request.model")
            value = point.count if kind == "histogram" else point.as_int or point.as_double
            found.setdefault(metric.name, {})[model] = value
    return found


def record(instruments: Instruments, *reports: RequestReport) -> None:
    for made in reports:
        instruments.record(made, made.model, "pi", PriceList())


def test_delta_points_count_each_period_alone() -> None:
    instruments = Instruments(UPSTREAM, delta=True, start_ns=0)
    record(instruments, report(prompt=10), report(prompt=20, stream=True))
    first = exported(instruments, 1)
    record(instruments, report(prompt=5), report(prompt=7), report(prompt=1, stream=True))
    second = exported(instruments, 2)
    assert first["gen_ai.client.inference.usage.input_tokens"] == {"m": 30}
    assert second["gen_ai.client.inference.usage.input_tokens"] == {"m": 13}
    assert first["gen_ai.client.inference.usage.output_tokens"] == {"m": 4}
    assert second["gen_ai.client.inference.usage.cache_read.input_tokens"] == {"m": 3}
    assert first["tailfloor.floors"] == {None: 2} and second["tailfloor.floors"] == {None: 3}
    assert first["gen_ai.client.inference.duration"] == {"m": 2}
    assert second["gen_ai.client.inference.duration"] == {"m": 3}
    assert first["gen_ai.client.inference.time_to_first_chunk"] == {"m": 1}
    assert second["gen_ai.client.inference.time_to_first_chunk"] == {"m": 1}
    assert exported(instruments, 3) == {}  # nothing came since


def test_cumulative_points_keep_adding_past_the_bound_of_kept_shapes() -> None:
    instruments = Instruments(UPSTREAM, delta=False, start_ns=0)
    record(instruments, report("first", prompt=10))
    assert exported(instruments, 1)["tailfloor.floors"] == {None: 1}
    # More (model, agent, route) shapes than are kept: the first one's is made again.
    record(instruments, *(report(f"model-{n}", prompt=1) for n in range(4100)))
    record(instruments, report("first", prompt=5, stream=True))
    totals = exported(instruments, 2)
    assert totals["gen_ai.client.inference.usage.input_tokens"]["first"] == 15
    assert totals["gen_ai.client.inference.duration"]["first"] == 2
    assert totals["gen_ai.client.inference.time_to_first_chunk"] == {"first": 1}
    assert totals["tailfloor.floors"] == {None: 4102}


def test_each_metric_says_its_own_name_unit_and_description() -> None:
    instruments = Instruments(UPSTREAM, delta=False, start_ns=0)
    costly = report(stream=True)
    costly.carried, costly.restored, costly.overflow, costly.compaction = 2, 3, "recovered", "c"
    record(instruments, costly)
    body = wire.export_metrics(b"", wire.scope("t"), instruments.collect(1))
    metrics = ExportMetricsServiceRequest.FromString(body).resource_metrics[0] \
        .scope_metrics[0].metrics
    expected = {name: (unit, description) for name, unit, description, *_ in
                (*_COUNTERS, _DURATION, _FIRST_CHUNK)}
    assert len(metrics) >= 9
    for metric in metrics:
        assert (metric.unit, metric.description) == expected[metric.name]

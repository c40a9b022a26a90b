"""The report sink that exports over OTLP/HTTP: spans made after the fact from each finished
request's report, with the times and ids the request path recorded, and the metrics.

Nothing here runs on the request path but ``keep``, which queues the report (without its
body and messages: no content reaches this module, and a queued report holds no request's
memory) for a thread of its own: building spans through the SDK costs more than a request's
own work, so it is done in batches off the event loop. Export runs on the SDK's threads,
so a collector that is down or slow costs requests nothing (what cannot be sent is dropped
and counted: ``exporting.py``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from proxy.metrics import Metrics
from proxy.policy.prices import PriceList
from proxy.report import RequestReport
from proxy.telemetry.attributes import SpanPlan, Upstream, plan_spans
from proxy.telemetry.config import Sampler as SamplerConfig
from proxy.telemetry.config import TelemetryConfig
from proxy.telemetry.exporting import (
    Episodes,
    WatchedMetricExporter,
    WatchedSpanExporter,
    quieten_sdk,
)
from proxy.telemetry.meters import Instruments
from proxy.telemetry.tracecontext import ids_of, parse_traceparent

__all__ = ["TelemetrySink"]

_QUEUE = 2048  # spans held while a collector does not answer; more are dropped
_PENDING = 4096  # reports waiting for the telemetry thread; more are dropped
_POLL = 0.1  # seconds between the thread's looks at the queue
log = logging.getLogger("tailfloor.telemetry")
_SCOPE = "tailfloor"


class PresetIds(IdGenerator):
    """Random ids, except the one the sink sets just before starting a span: the ids the
    request path already sent upstream. Used from the telemetry thread only."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.span_id: int | None = None
        self.trace_id: int | None = None

    def generate_span_id(self) -> int:
        found, self.span_id = self.span_id, None
        return found or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        found, self.trace_id = self.trace_id, None
        return found or self._random.generate_trace_id()


class TelemetrySink:
    def __init__(self, config: TelemetryConfig, metrics: Metrics, upstream_url: str,
                 prices: Callable[[], PriceList]) -> None:
        quieten_sdk()
        self._upstream = Upstream.of(upstream_url)
        self._label, self._agent_label = metrics.model_label, metrics.agent_label
        dropped = metrics.otlp_dropped
        self._reports_dropped = dropped.labels(signal="reports")
        self.episodes = Episodes(lambda signal, n: dropped.labels(signal=signal).inc(n))
        resource = Resource({"service.name": config.service_name, **dict(config.resource)})
        headers = dict(config.headers)
        self._ids = PresetIds()
        self._tracer: trace.Tracer | None = None
        self._traces: TracerProvider | None = None
        if config.traces_endpoint is not None:
            self._traces = TracerProvider(resource=resource, sampler=_sampler(config.sampler),
                                          id_generator=self._ids, shutdown_on_exit=False)
            exporter = WatchedSpanExporter(
                OTLPSpanExporter(config.traces_endpoint, headers=headers,
                                 timeout=config.timeout),
                config.traces_endpoint, self.episodes)
            self._traces.add_span_processor(BatchSpanProcessor(
                exporter, max_queue_size=_QUEUE, schedule_delay_millis=1000,
                max_export_batch_size=512, export_timeout_millis=config.timeout * 1000))
            self._tracer = self._traces.get_tracer(_SCOPE)
        self._meters: MeterProvider | None = None
        self._instruments: Instruments | None = None
        if config.metrics_endpoint is not None:
            reader = PeriodicExportingMetricReader(
                WatchedMetricExporter(
                    OTLPMetricExporter(config.metrics_endpoint, headers=headers,
                                       timeout=config.timeout),
                    config.metrics_endpoint, self.episodes),
                export_interval_millis=config.export_interval * 1000,
                export_timeout_millis=config.timeout * 1000)
            self._meters = MeterProvider(metric_readers=[reader], resource=resource,
                                         shutdown_on_exit=False)
            self._instruments = Instruments(self._meters.get_meter(_SCOPE), self._upstream,
                                            self._label, self._agent_label, prices)
        self._pending: deque[RequestReport] = deque()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._work, name="tailfloor-telemetry",
                                        daemon=True)
        self._thread.start()

    @property
    def traces(self) -> bool:
        """Spans are exported: the request path sends its own traceparent upstream."""
        return self._tracer is not None

    def keep(self, report: RequestReport) -> None:
        if len(self._pending) >= _PENDING:
            self._reports_dropped.inc()
            return
        self._pending.append(replace(report, body=None, messages=None, origins=None))

    def _work(self) -> None:
        failed = False
        while True:
            stopping = self._stopping.wait(_POLL)
            while self._pending:
                report = self._pending.popleft()
                try:
                    self._export(report)
                except Exception:  # a bug here costs telemetry, never a request
                    if not failed:
                        failed = True
                        log.exception("telemetry could not describe a request; further "
                                      "failures like it are not logged")
            if stopping:
                return

    def _export(self, report: RequestReport) -> None:
        if self._instruments is not None:
            self._instruments.record(report)
        if self._tracer is not None:
            self._spans(self._tracer, report)

    def _spans(self, tracer: trace.Tracer, report: RequestReport) -> None:
        plans = plan_spans(report, self._upstream, self._label, self._agent_label,
                           lambda traceparent: ids_of(traceparent)[1])
        server, rest = plans[0], plans[1:]
        client = parse_traceparent(report.traceparent)
        parent = otel_context.Context()
        if client is not None and client.parent_id is not None:
            parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
                int(client.trace_id, 16), int(client.parent_id, 16), is_remote=True,
                trace_flags=trace.TraceFlags(int(client.flags, 16)))))
        else:
            sent = next((a.traceparent for a in report.attempts if a.traceparent), None)
            self._ids.trace_id = ids_of(sent)[0] if sent else None
        span = _start(tracer, self._ids, server, parent)
        inside = trace.set_span_in_context(span)
        for plan in rest:
            _start(tracer, self._ids, plan, inside).end(_nanos(plan.end))
        span.end(_nanos(server.end))

    def shutdown(self) -> None:
        """Flush what is queued (bounded by the export timeout) and stop the threads."""
        self._stopping.set()
        self._thread.join()
        if self._traces is not None:
            self._traces.shutdown()
        if self._meters is not None:
            self._meters.shutdown()


def _start(tracer: trace.Tracer, ids: PresetIds, plan: SpanPlan,
           parent: otel_context.Context) -> trace.Span:
    ids.span_id = plan.span_id
    span = tracer.start_span(plan.name, context=parent,
                             kind=SpanKind.SERVER if plan.kind == "server" else SpanKind.CLIENT,
                             attributes=plan.attributes, start_time=_nanos(plan.start))
    ids.span_id = ids.trace_id = None  # a span the sampler dropped did not take them
    if plan.error is not None:
        span.set_status(Status(StatusCode.ERROR))
    return span


def _nanos(seconds: float) -> int:
    return int(seconds * 1e9)


def _sampler(config: SamplerConfig) -> Sampler:
    root: Sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(
        config.name.removeprefix("parentbased_"), TraceIdRatioBased(config.ratio))
    return ParentBased(root) if config.name.startswith("parentbased_") else root

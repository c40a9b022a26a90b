"""The OTLP exporters, watched: a collector that fails is said once per episode (a WARNING
when export starts failing, an INFO when it works again) and what it could not take is
counted, never retried from the request path.

The SDK's exporters and processors log every failed batch themselves; their loggers are
quietened here because a collector down for an hour would otherwise write a line per
batch, and tailfloor's own line says the same once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["Episodes", "WatchedMetricExporter", "WatchedSpanExporter", "quieten_sdk"]

log = logging.getLogger("tailfloor.telemetry")


def quieten_sdk() -> None:
    for name in ("opentelemetry.exporter", "opentelemetry.sdk._shared_internal",
                 "opentelemetry.sdk.metrics._internal.export"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


class Episodes:
    """Failing or not, per signal; the export threads report here."""

    def __init__(self, on_dropped: Callable[[str, int], None]) -> None:
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._on_dropped = on_dropped

    def outcome(self, signal: str, ok: bool, items: int, endpoint: str) -> None:
        with self._lock:
            was = signal in self._failing
            if ok:
                self._failing.discard(signal)
            else:
                self._failing.add(signal)
        if not ok:
            self._on_dropped(signal, items)
        if not ok and not was:
            # The endpoint only: its headers may carry a key.
            log.warning("OTLP export of %s to %s failed; requests are not affected, what "
                        "cannot be sent is dropped and counted until it works again",
                        signal, endpoint)
        elif ok and was:
            log.info("OTLP export of %s to %s works again", signal, endpoint)


class WatchedSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter, endpoint: str, episodes: Episodes) -> None:
        self._inner, self._endpoint, self._episodes = inner, endpoint, episodes

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:  # the exporter's bug: the same as a failed export
            result = SpanExportResult.FAILURE
        self._episodes.outcome("traces", result is SpanExportResult.SUCCESS, len(spans),
                               self._endpoint)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class WatchedMetricExporter(MetricExporter):
    def __init__(self, inner: MetricExporter, endpoint: str, episodes: Episodes) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner, self._endpoint, self._episodes = inner, endpoint, episodes

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis)
        except Exception:
            result = MetricExportResult.FAILURE
        self._episodes.outcome("metrics", result is MetricExportResult.SUCCESS, 1,
                               self._endpoint)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)

"""The thread that sends: encoded spans in batches, as the specification's batch span
processor does (OTEL_BSP_*), and the metric exports the telemetry thread hands it.

It is the only thread that waits on a collector, so a slow or absent one holds nothing but
this thread: the spans queue is bounded, in spans (OTEL_BSP_MAX_QUEUE_SIZE) and in bytes
(``QUEUE_BYTES``: with captured content one span can be a megabyte), and what does not fit,
or what a failed export carried, is dropped and counted (``tailfloor_otlp_dropped_total``).
A batch goes when it is full (OTEL_BSP_MAX_EXPORT_BATCH_SIZE spans, or as many bytes as one
request may carry) or when the schedule delay has passed since the last; shutdown sends what
is queued within the exporter's timeout.

One export request is at most ``REQUEST_BYTES`` (before any gzip, which only makes it
smaller): a collector refuses a request past its own limit as a whole (4 MiB is common), so a
batch is cut short to fit, and a span that could never fit is dropped, counted, never sent.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from proxy.telemetry.config import TelemetryConfig
from proxy.telemetry.exporting import Endpoint, Episodes

__all__ = ["Poster"]

_METRIC_EXPORTS = 2  # held while a collector does not answer; an older one is dropped
QUEUE_BYTES = 32 * 1024 * 1024  # encoded spans waiting to be sent
REQUEST_BYTES = 4 * 1024 * 1024  # one ExportTraceServiceRequest, as posted uncompressed
# What the request's three enclosing length prefixes may grow by, past the empty batch's.
_FRAMING = 16


class Poster:
    def __init__(self, config: TelemetryConfig, traces: Endpoint | None,
                 metrics: Endpoint | None, *, episodes: Episodes,
                 batch_of: Callable[[Sequence[bytes]], bytes],
                 on_dropped: Callable[[str, int], None], queue_bytes: int | None = None,
                 request_bytes: int | None = None) -> None:
        """``batch_of``: the ExportTraceServiceRequest of framed spans. ``queue_bytes``,
        ``request_bytes``: the bounds (QUEUE_BYTES, REQUEST_BYTES when None)."""
        self._traces, self._metrics = traces, metrics
        self._episodes, self._batch_of, self._on_dropped = episodes, batch_of, on_dropped
        self._delay, self._max_queue = config.schedule_delay, config.max_queue
        self._max_batch = config.max_batch
        # One export call, bounded by its signal's whole-export timeout.
        self._span_timeout = min(config.timeout, config.export_timeout)
        self._metric_timeout = min(config.timeout, config.metric_timeout)
        self._flush_bound = config.timeout
        self._spans: deque[bytes] = deque()
        # The spans' bytes, kept with the deque under the lock (both threads change them).
        self._lock = threading.Lock()
        self._queued_bytes = 0
        self._queue_bytes = QUEUE_BYTES if queue_bytes is None else queue_bytes
        # Bytes of spans one request may carry: its limit less the rest of the request.
        self._room = (REQUEST_BYTES if request_bytes is None else request_bytes) \
            - len(batch_of(())) - _FRAMING
        self._metric_exports: deque[bytes] = deque()
        self._wake = threading.Event()
        self._flush = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tailfloor-otlp-poster",
                                        daemon=True)
        self._thread.start()

    def add_spans(self, spans: Sequence[bytes]) -> None:
        """From the telemetry thread: framed spans to send."""
        room = self._room
        dropped = 0
        with self._lock:
            size = sum(map(len, spans))
            if len(self._spans) + len(spans) <= self._max_queue and size <= room \
                    and self._queued_bytes + size <= self._queue_bytes:
                self._spans.extend(spans)  # all fit (their sum within one request's room)
                spans, self._queued_bytes = (), self._queued_bytes + size
            for span in spans:
                size = len(span)
                if size > room or len(self._spans) >= self._max_queue \
                        or self._queued_bytes + size > self._queue_bytes:
                    dropped += 1
                    continue
                self._spans.append(span)
                self._queued_bytes += size
            full = self._full()
        if dropped:
            self._on_dropped("traces", dropped)
        if full:
            self._wake.set()

    def flush(self) -> None:
        """From the telemetry thread, once it has handed over what was due: send every
        span queued now, a partial batch too (the telemetry thread keeps the schedule)."""
        with self._lock:
            self._flush = True
        self._wake.set()

    def _full(self) -> bool:
        """A whole batch is queued (in spans or in bytes). Under the lock."""
        return len(self._spans) >= self._max_batch or self._queued_bytes >= self._room

    def add_metrics(self, body: bytes) -> None:
        """From the telemetry thread: one ExportMetricsServiceRequest to send."""
        if len(self._metric_exports) >= _METRIC_EXPORTS:
            self._metric_exports.popleft()
            self._on_dropped("metrics", 1)
        self._metric_exports.append(body)
        self._wake.set()

    def _run(self) -> None:
        due = time.monotonic() + self._delay
        while not self._stopping:
            # Woken by a full batch or a metric export, else once per schedule delay.
            self._wake.wait(max(due - time.monotonic(), 0.0))
            self._wake.clear()
            if self._stopping:
                break
            # What is queued now, and no more: a collector slower than what comes in must
            # not keep one signal waiting on the other.
            for _ in range(len(self._metric_exports)):
                if self._stopping:
                    break
                self._send_metrics(self._metric_exports.popleft(), self._metric_timeout)
            now = time.monotonic()
            # Full batches now; a partial one only once the delay has passed (or the
            # telemetry thread says it has). No more batches than the spans queued now (a
            # batch carries one at least).
            with self._lock:  # a flush asked meanwhile is not lost
                due_now, self._flush = now >= due or self._flush, False
            for _ in range(len(self._spans)):
                with self._lock:
                    go = bool(self._spans) and (due_now or self._full())
                if self._stopping or not go:
                    break
                self._send_batch(self._span_timeout)
            if due_now:
                due = time.monotonic() + self._delay

    def _take(self) -> list[bytes]:
        """The next batch: up to the batch size, within one request's bytes (every queued
        span fits one alone)."""
        spans, size = self._spans, 0
        batch: list[bytes] = []
        with self._lock:
            if len(spans) <= self._max_batch and self._queued_bytes <= self._room:
                batch, self._queued_bytes = list(spans), 0  # all of it: most batches
                spans.clear()
                return batch
            while spans and len(batch) < self._max_batch \
                    and size + len(spans[0]) <= self._room:
                span = spans.popleft()
                size += len(span)
                batch.append(span)
            self._queued_bytes -= size
        return batch

    def _send_batch(self, timeout: float) -> None:
        batch = self._take()
        if self._traces is None or not batch:
            return
        ok = self._traces.post(self._batch_of(batch), timeout)
        self._episodes.outcome("traces", ok, len(batch), self._traces.shown)

    def _send_metrics(self, body: bytes, timeout: float) -> None:
        if self._metrics is None:
            return
        ok = self._metrics.post(body, timeout)
        self._episodes.outcome("metrics", ok, 1, self._metrics.shown)

    def shutdown(self) -> None:
        """Send what is queued (within the exporter's timeout, all of it; what is left then
        is dropped and counted) and stop."""
        deadline = time.monotonic() + self._flush_bound
        self._stopping = True
        self._wake.set()
        # The post under way ends within its own timeout (no longer than the bound).
        self._thread.join(self._flush_bound + 1.0)
        if self._thread.is_alive():  # never expected: drop what is queued, touch nothing
            self._on_dropped("metrics", len(self._metric_exports))
            self._on_dropped("traces", len(self._spans))
            return
        while self._metric_exports and time.monotonic() < deadline:
            self._send_metrics(self._metric_exports.popleft(),
                               min(self._metric_timeout, deadline - time.monotonic()))
        while self._spans and time.monotonic() < deadline:
            self._send_batch(min(self._span_timeout, deadline - time.monotonic()))
        if self._metric_exports:
            self._on_dropped("metrics", len(self._metric_exports))
        if self._spans:
            self._on_dropped("traces", len(self._spans))
        for endpoint in (self._traces, self._metrics):
            if endpoint is not None:
                endpoint.end()

"""The report sink that exports over OTLP/HTTP: spans made after the fact from each finished
request's report, with the times and ids the request path recorded, and the metrics.

Nothing here runs on the request path but ``keep``, which queues the report (without its
body and messages, so a queued report holds no request's memory, unless
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT asks for the messages sent, within a
bound of the bytes the parsed messages hold) for the telemetry thread, which encodes the
spans (spans.py) and adds to the metric aggregates (meters.py). Sending is another thread's
(poster.py), so a collector that is down or slow costs requests nothing and the telemetry
thread nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from proxy import __version__
from proxy.metrics import BoundedLabel, Metrics
from proxy.policy.prices import PriceList
from proxy.report import RequestReport
from proxy.telemetry import protowire as wire
from proxy.telemetry.attributes import Upstream
from proxy.telemetry.config import TelemetryConfig
from proxy.telemetry.content import held_bytes
from proxy.telemetry.exporting import Endpoint, Episodes
from proxy.telemetry.meters import Instruments
from proxy.telemetry.poster import Poster
from proxy.telemetry.sampling import TraceSampler
from proxy.telemetry.spans import SpanEncoder

__all__ = ["TelemetrySink"]

_PENDING = 4096  # reports waiting for the telemetry thread; more are dropped
# Bytes of parsed messages (as content.held_bytes weighs them) that may wait for the
# telemetry thread, when content is captured; a report past it goes without its content
# (counted).
_CONTENT_HELD = 64 * 1024 * 1024
_MOST_PER_BYTE = 32  # what one byte of JSON can hold, parsed, at most
_SCOPE = wire.scope("tailfloor", __version__)
log = logging.getLogger("tailfloor.telemetry")


class TelemetrySink:
    def __init__(self, config: TelemetryConfig, metrics: Metrics, upstream_url: str,
                 prices: Callable[[], PriceList]) -> None:
        upstream = Upstream.of(upstream_url)
        label, agent_label = metrics.model_label, metrics.agent_label
        self._label, self._agent_label = label, agent_label
        dropped = metrics.otlp_dropped

        def on_dropped(signal: str, count: int) -> None:
            dropped.labels(signal=signal).inc(count)

        self._reports_dropped = dropped.labels(signal="reports")
        self.episodes = Episodes(on_dropped)
        self._resource = wire.resource((("service.name", config.service_name),
                                        *config.resource))
        headers = dict(config.headers)
        self._sampler: TraceSampler | None = None
        self._spans: SpanEncoder | None = None
        traces = metrics_endpoint = None
        if config.traces_endpoint is not None:
            self._sampler = TraceSampler(config.sampler)
            self._spans = SpanEncoder(upstream, label, agent_label,
                                      _answered_models(BoundedLabel(64, vetted=True)),
                                      self._sampler, content_limit=config.content_limit
                                      if config.capture_content else None)
            traces = Endpoint(config.traces_endpoint, headers, compress=config.gzip,
                              certificate=config.certificate)
        self._instruments: Instruments | None = None
        if config.metrics_endpoint is not None:
            self._instruments = Instruments(upstream, delta=config.delta,
                                            start_ns=time.time_ns())
            metrics_endpoint = Endpoint(config.metrics_endpoint, headers,
                                        compress=config.gzip, certificate=config.certificate)
        self._interval = config.export_interval
        self._prices = prices
        self._poster = Poster(config, traces, metrics_endpoint, episodes=self.episodes,
                              batch_of=self._batch_of, on_dropped=on_dropped)
        self._pending: deque[RequestReport] = deque()
        self.wants_content = config.capture_content
        self._content_dropped = dropped.labels(signal="content")
        self._held_lock = threading.Lock()
        self._held = 0  # bytes the queued messages hold
        self._weights: deque[int] = deque()  # each queued report with messages: its bytes
        # The thread looks at its queue once per span export (OTEL_BSP_SCHEDULE_DELAY),
        # then has the poster send: spans wait no longer than that, and an idle process
        # wakes once per delay, not many times. Sooner when the queue is half full; once
        # per metric export when only metrics are sent.
        self._poll = config.schedule_delay if self._spans is not None \
            else config.export_interval
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="tailfloor-telemetry",
                                        daemon=True)
        self._thread.start()

    @property
    def traces(self) -> TraceSampler | None:
        """Spans are exported (by this sampler): the request path sends its own
        traceparent upstream, its sampled flag this sampler's decision."""
        return self._sampler

    def keep(self, report: RequestReport) -> None:
        if len(self._pending) >= _PENDING:
            self._reports_dropped.inc()
            return
        if report.body is not None or report.messages is not None \
                or report.origins is not None:
            # The recorder's reports come without them unless content is captured; a copy
            # costs as much as the rest of this export, so only when they are there.
            report = self._content_of(report)
        pending = self._pending
        pending.append(report)
        if len(pending) == _PENDING // 2:
            self._wake.set()

    def _content_of(self, report: RequestReport) -> RequestReport:
        """The report as queued: its messages kept only when captured and within the bound
        (they hold the request's parsed body until the telemetry thread is done)."""
        if self.wants_content and report.messages is not None:
            # Weighed as held, not as the body's length: parsed, a body can weigh twenty
            # times its bytes. Past the objects weighed on the request path, the most it
            # can weigh (an empty object, "{}," in a list, is 64 bytes for 3).
            weight = held_bytes(report.messages, _CONTENT_HELD)
            if weight is None:
                weight = len(report.body) * _MOST_PER_BYTE if report.body is not None \
                    else _CONTENT_HELD + 1
            with self._held_lock:
                room = self._held + weight <= _CONTENT_HELD
                if room:
                    self._held += weight
                    self._weights.append(weight)
            if room:
                return replace(report, body=None, origins=None)
            self._content_dropped.inc()
        return replace(report, body=None, messages=None, origins=None)

    def _release(self, report: RequestReport) -> None:
        if report.messages is not None:
            with self._held_lock:
                if self._weights:
                    self._held -= self._weights.popleft()

    def _batch_of(self, spans: Sequence[bytes]) -> bytes:
        return wire.export_traces(self._resource, _SCOPE, spans)

    def _work(self) -> None:
        failing = False
        due = time.monotonic() + self._interval
        while True:
            woken = self._wake.wait(max(min(self._poll, due - time.monotonic()), 0.0)
                                    if self._instruments is not None else self._poll)
            self._wake.clear()
            stopping = self._stopping
            built: list[bytes] = []
            pending, instruments, spans = self._pending, self._instruments, self._spans
            models, agents = self._label, self._agent_label
            # A label already given is itself (BoundedLabel): looked up, not called.
            known_models, known_agents = models.seen, agents.seen
            prices = self._prices() if instruments is not None else PriceList()
            while pending:
                report = pending.popleft()
                if report.messages is not None:
                    self._release(report)
                try:
                    model = report.model
                    if model not in known_models:
                        model = models(model)
                    agent = report.agent or "none"
                    if agent not in known_agents:
                        agent = agents(agent)
                    if instruments is not None:
                        instruments.record(report, model, agent, prices)
                    if spans is not None:
                        built += spans.encode(report, model, agent)
                except Exception:  # a bug here costs telemetry, never a request
                    if not failing:  # once per episode: the first failure after a success
                        failing = True
                        log.exception("telemetry could not describe a request; further "
                                      "failures like it are not logged until one works")
                    continue
                if failing:
                    failing = False
                    log.info("telemetry describes requests again")
            if built:
                self._poster.add_spans(built)
            if self._spans is not None and not stopping and not woken:
                self._poster.flush()  # the schedule's turn: partial batches go too
            if self._instruments is not None and (stopping or time.monotonic() >= due):
                due = time.monotonic() + self._interval
                found = self._instruments.collect(time.time_ns())
                if found:
                    self._poster.add_metrics(wire.export_metrics(self._resource, _SCOPE,
                                                                 found))
            if stopping:
                return

    def shutdown(self) -> None:
        """Describe what is queued, send it (bounded by the exporter's timeout) and stop
        the threads."""
        self._stopping = True
        self._wake.set()
        self._thread.join()
        self._poster.shutdown()


def _answered_models(labels: BoundedLabel) -> Callable[[str | None], str]:
    """``gen_ai.response.model``: the model an upstream's successful answer named, vetted
    as the Prometheus model label is (a plain name, no credential, at most 64 of them; else
    ``other``)."""
    found: dict[str | None, str] = {}  # a label, once given, stays what it is

    def label(model: str | None) -> str:
        given = found.get(model)
        if given is None:
            labels.admit(model)
            given = labels(model)
            if len(found) < 1024:
                found[model] = given
        return given

    return label

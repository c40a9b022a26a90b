"""A real OTLP/HTTP receiver for the telemetry tests: ``POST /v1/traces`` and
``/v1/metrics`` in protobuf, decoded with opentelemetry-proto, every byte kept.

``mode``: ``ok`` answers 200; ``slow_503`` holds each request ``delay`` seconds, then
answers 503 (a collector overloaded); ``stop()`` closes the socket (connection refused).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    def __init__(self, port: int = 0, *, keep_alive: bool = False) -> None:
        """``keep_alive``: HTTP/1.1 with kept-alive connections, as collectors answer (the
        benchmarks'); else each post on a connection of its own (``stop`` then refuses the
        next post at once)."""
        self.raw: list[bytes] = []  # every body and header block received
        self.sizes: list[int] = []  # every body's length, as posted
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.mode = "ok"
        self.delay = 0.0
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.posts += 1
                    receiver.sizes.append(len(body))
                    receiver.raw.append(str(self.headers).encode() + body)
                if receiver.mode == "slow_503":
                    time.sleep(receiver.delay)
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/v1/traces":
                    traces = ExportTraceServiceRequest.FromString(body)
                    with receiver._lock:
                        receiver.traces.append(traces)
                elif self.path == "/v1/metrics":
                    metrics = ExportMetricsServiceRequest.FromString(body)
                    with receiver._lock:
                        receiver.metrics.append(metrics)
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> list[Any]:
        with self._lock:
            requests = list(self.traces)
        return [span for request in requests for resource in request.resource_spans
                for scope in resource.scope_spans for span in scope.spans]

    def resources(self) -> list[dict[str, Any]]:
        with self._lock:
            requests = list(self.traces) + list(self.metrics)
        return [attributes(resource.resource.attributes) for request in requests
                for resource in getattr(request, "resource_spans", None)
                or request.resource_metrics]

    def points(self, name: str) -> list[Any]:
        """Every data point of metric ``name`` received (cumulative: the last is the total)."""
        with self._lock:
            requests = list(self.metrics)
        found = []
        for request in requests:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name == name:
                            kind = metric.WhichOneof("data")
                            found.extend(getattr(metric, kind).data_points)
        return found

    def total(self, name: str) -> float:
        """A cumulative counter's total: its points in the latest export that has it."""
        with self._lock:
            requests = list(self.metrics)
        for request in reversed(requests):
            points = [point for resource in request.resource_metrics
                      for scope in resource.scope_metrics for metric in scope.metrics
                      if metric.name == name for point in metric.sum.data_points]
            if points:
                return sum(point.as_int or point.as_double for point in points)
        return 0

    def wait(self, what: Callable[[], Any], bound: float = 15.0) -> Any:
        deadline = time.monotonic() + bound
        while not (found := what()):
            assert time.monotonic() < deadline, f"the receiver never had it in {bound} s"
            time.sleep(0.05)
        return found


def attributes(pairs: Iterator[Any] | Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[pair.key] = tuple(getattr(v, v.WhichOneof("value"))
                                  for v in value.array_value.values)
        else:
            out[pair.key] = getattr(value, kind) if kind else None
    return out

"""The OTLP instruments: the GenAI client-inference metrics and tailfloor's own, fed from
each finished request's report with the counts Prometheus is given for the same request.

The counters are kept here as plain sums, by attribute set, and read by observable counters
when the SDK collects (every export interval): the SDK's synchronous ``add`` validates and
hashes its attributes on every call, which cost more than the rest of a request's report.
Only the two histograms are recorded as they come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from proxy.cost import costs_of
from proxy.policy.prices import PriceList
from proxy.report import RequestReport
from proxy.telemetry.attributes import Label, Upstream

__all__ = ["Instruments"]

_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                     20.48, 40.96, 81.92]
_CHUNK_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0]
Attributes = tuple[tuple[str, str | int], ...]

# name, unit, description of each counter, in the order record() fills them.
_COUNTERS = (
    ("gen_ai.client.inference.usage.input_tokens", "{token}",
     "Input tokens the upstream reported, cached ones included"),
    ("gen_ai.client.inference.usage.output_tokens", "{token}",
     "Output tokens the upstream reported"),
    ("gen_ai.client.inference.usage.cache_read.input_tokens", "{token}",
     "Input tokens the upstream served from its cache"),
    ("tailfloor.floors", "{request}", "Requests by what the floor did (kind)"),
    ("tailfloor.carried.messages", "{message}", "Messages carried across a reset"),
    ("tailfloor.restored.messages", "{message}", "Messages the floor restored"),
    ("tailfloor.overflows", "{request}", "Context overflows by outcome"),
    ("tailfloor.compactions", "{request}", "Requests sent compacted, by label"),
    ("tailfloor.cost", "USD", "Dollars by the rules' [[prices]], by kind (request, floor, "
     "summary, saved), as tailfloor_cost_usd_total"),
)


class Instruments:
    def __init__(self, meter: Meter, upstream: Upstream, label: Label,
                 agent_label: Label, prices: Callable[[], PriceList]) -> None:
        self._upstream, self._label, self._agent_label = upstream, label, agent_label
        self._prices = prices
        # Bounded: model and agent labels are capped like Prometheus's, the rest are enums.
        self._sums: dict[str, dict[Attributes, float]] = {name: {} for name, _, _ in _COUNTERS}
        self._lock = threading.Lock()  # the SDK collects on its own thread
        for name, unit, description in _COUNTERS:
            meter.create_observable_counter(name, [self._reader(name)], unit, description)
        self.duration = meter.create_histogram(
            "gen_ai.client.inference.duration", "s", "Each upstream attempt, to its end",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.first_chunk = meter.create_histogram(
            "gen_ai.client.inference.time_to_first_chunk", "s",
            "From sending a streamed request to its first chunk",
            explicit_bucket_boundaries_advisory=_CHUNK_BUCKETS)

    def _reader(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        sums = self._sums[name]

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                found = list(sums.items())
            return [Observation(value, dict(attributes)) for attributes, value in found]

        return observe

    def _add(self, name: str, value: float, attributes: Attributes) -> None:
        sums = self._sums[name]
        with self._lock:
            sums[attributes] = sums.get(attributes, 0) + value

    def record(self, report: RequestReport) -> None:
        model = self._label(report.model)
        agent = self._agent_label(report.agent or "none")
        provider = self._upstream.provider or (
            "anthropic" if report.route == "messages" else "openai")
        base: Attributes = (
            ("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", provider),
            ("gen_ai.request.model", model), ("server.address", self._upstream.address),
            ("server.port", self._upstream.port))
        own: Attributes = (("tailfloor.agent", agent), ("tailfloor.route", report.route))
        usage = report.usage
        if usage is not None:
            tokens = (*base, *own, ("gen_ai.token.modality", "text"))
            for name, value in ((_COUNTERS[0][0], usage.prompt_tokens),
                                (_COUNTERS[1][0], usage.completion_tokens),
                                (_COUNTERS[2][0], usage.cached_tokens)):
                if value:
                    self._add(name, value, tokens)
        self._histograms(report, dict(base))
        self._add("tailfloor.floors", 1, (*own, ("tailfloor.floor.kind", report.floor_kind)))
        if report.carried:
            self._add("tailfloor.carried.messages", report.carried, own)
        if report.restored:
            self._add("tailfloor.restored.messages", report.restored, own)
        if report.overflow is not None:
            self._add("tailfloor.overflows", 1, (*own, ("tailfloor.overflow", report.overflow)))
        if report.compaction is not None:
            self._add("tailfloor.compactions", 1,
                      (*own, ("tailfloor.compaction", report.compaction)))
        prices = self._prices()
        costs = costs_of(report, prices) if prices else None
        if costs is not None:
            for kind, dollars in costs.items():
                if dollars:
                    self._add("tailfloor.cost", dollars, (
                        *own, ("gen_ai.request.model", model), ("tailfloor.cost.kind", kind)))

    def _histograms(self, report: RequestReport, base: dict[str, str | int]) -> None:
        last = len(report.attempts) - 1
        for index, attempt in enumerate(report.attempts):
            seconds = report.seconds - attempt.started if index == last \
                and attempt.error is None else attempt.latency
            error = attempt.error or (str(attempt.status) if attempt.status is not None
                                      and attempt.status >= 400 else None)
            self.duration.record(max(seconds, 0.0),
                                 {**base, "error.type": error} if error else base)
            if attempt.first_chunk is not None:
                self.first_chunk.record(max(attempt.first_chunk - attempt.started, 0.0), base)

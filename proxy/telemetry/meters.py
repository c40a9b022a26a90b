"""The OTLP instruments: the GenAI client-inference metrics and tailfloor's own, fed from
each finished request's report with the counts Prometheus is given for the same request."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.metrics import Meter

from proxy.cost import costs_of
from proxy.policy.prices import PriceList
from proxy.report import RequestReport
from proxy.telemetry.attributes import Label, Upstream

__all__ = ["Instruments"]

_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                     20.48, 40.96, 81.92]
_CHUNK_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0]


class Instruments:
    def __init__(self, meter: Meter, upstream: Upstream, label: Label,
                 agent_label: Label, prices: Callable[[], PriceList]) -> None:
        self._upstream, self._label, self._agent_label = upstream, label, agent_label
        self._prices = prices
        token = "{token}"
        self.input_tokens = meter.create_counter(
            "gen_ai.client.inference.usage.input_tokens", token,
            "Input tokens the upstream reported, cached ones included")
        self.output_tokens = meter.create_counter(
            "gen_ai.client.inference.usage.output_tokens", token,
            "Output tokens the upstream reported")
        self.cache_read = meter.create_counter(
            "gen_ai.client.inference.usage.cache_read.input_tokens", token,
            "Input tokens the upstream served from its cache")
        self.duration = meter.create_histogram(
            "gen_ai.client.inference.duration", "s", "Each upstream attempt, to its end",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.first_chunk = meter.create_histogram(
            "gen_ai.client.inference.time_to_first_chunk", "s",
            "From sending a streamed request to its first chunk",
            explicit_bucket_boundaries_advisory=_CHUNK_BUCKETS)
        self.floors = meter.create_counter(
            "tailfloor.floors", "{request}", "Requests by what the floor did (kind)")
        self.carries = meter.create_counter(
            "tailfloor.carried.messages", "{message}", "Messages carried across a reset")
        self.restored = meter.create_counter(
            "tailfloor.restored.messages", "{message}", "Messages the floor restored")
        self.overflows = meter.create_counter(
            "tailfloor.overflows", "{request}", "Context overflows by outcome")
        self.cost = meter.create_counter(
            "tailfloor.cost", "USD", "Dollars by the rules' [[prices]], by kind (request, "
            "floor, summary, saved), as tailfloor_cost_usd_total")
        self.compactions = meter.create_counter(
            "tailfloor.compactions", "{request}", "Requests sent compacted, by label")

    def record(self, report: RequestReport) -> None:
        model = self._label(report.model)
        agent = self._agent_label(report.agent or "none")
        provider = self._upstream.provider or (
            "anthropic" if report.route == "messages" else "openai")
        base: dict[str, str | int] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
            "gen_ai.request.model": model, "server.address": self._upstream.address,
            "server.port": self._upstream.port}
        own: dict[str, str | int] = {"tailfloor.agent": agent, "tailfloor.route": report.route}
        usage = report.usage
        if usage is not None:
            tokens = {**base, **own, "gen_ai.token.modality": "text"}
            for counter, value in ((self.input_tokens, usage.prompt_tokens),
                                   (self.output_tokens, usage.completion_tokens),
                                   (self.cache_read, usage.cached_tokens)):
                if value:
                    counter.add(value, tokens)
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
        self.floors.add(1, {**own, "tailfloor.floor.kind": report.floor_kind})
        if report.carried:
            self.carries.add(report.carried, own)
        if report.restored:
            self.restored.add(report.restored, own)
        if report.overflow is not None:
            self.overflows.add(1, {**own, "tailfloor.overflow": report.overflow})
        if report.compaction is not None:
            self.compactions.add(1, {**own, "tailfloor.compaction": report.compaction})
        prices = self._prices()
        costs = costs_of(report, prices) if prices else None
        if costs is not None:
            for kind, dollars in costs.items():
                if dollars:
                    self.cost.add(dollars, {**own, "gen_ai.request.model": model,
                                            "tailfloor.cost.kind": kind})

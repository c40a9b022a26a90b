"""The OTLP metrics: the GenAI client-inference instruments and tailfloor's own, fed from
each finished request's report with the counts Prometheus is given for the same request.

Held as plain dicts keyed by attribute tuple (counters as sums; histograms as bucket counts,
sum, min and max) and encoded to OTLP only when an export is due: adding to a dict is all a
request costs. Used from the telemetry thread only, so nothing here locks. Bounded: model
and agent labels are capped like Prometheus's (proxy/metrics.py), the other attributes are
enums.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from proxy.cost import costs_of
from proxy.policy.prices import PriceList
from proxy.report import Attempt, RequestReport
from proxy.telemetry import protowire as wire
from proxy.telemetry.attributes import Upstream

__all__ = ["Instruments"]

# The GenAI conventions' advice for these two (client-inference metrics).
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                     20.48, 40.96, 81.92)
_CHUNK_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0)
Attributes = tuple[tuple[str, str | int], ...]

# name, unit, description of each counter.
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
_INPUT, _OUTPUT, _CACHED = (name for name, _, _ in _COUNTERS[:3])
_DURATION = ("gen_ai.client.inference.duration", "s", "Each upstream attempt, to its end",
             _DURATION_BUCKETS)
_FIRST_CHUNK = ("gen_ai.client.inference.time_to_first_chunk", "s",
                "From sending a streamed request to its first chunk", _CHUNK_BUCKETS)
# Each Metric's name, description and unit, encoded once (wire.metric's fields but its data).
_HEADS = {name: wire.delimited(wire.tag(1, 2), name.encode())
          + wire.delimited(wire.tag(2, 2), description.encode())
          + wire.delimited(wire.tag(3, 2), unit.encode())
          for name, unit, description, *_ in (*_COUNTERS, _DURATION, _FIRST_CHUNK)}
_METRIC = wire.tag(2, 2)  # ScopeMetrics.metrics


class _Histogram:
    """Explicit buckets as OTLP counts them: bucket i holds bounds[i-1] < v <= bounds[i]."""

    __slots__ = ("counts", "maximum", "minimum", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.total = 0.0
        self.minimum = float("inf")
        self.maximum = float("-inf")

    def add(self, value: float, bounds: tuple[float, ...]) -> None:
        self.counts[bisect_left(bounds, value)] += 1
        self.total += value
        # Comparisons, not min() and max(): a call costs more (every attempt passes here).
        if value < self.minimum:  # noqa: PLR1730
            self.minimum = value
        if value > self.maximum:  # noqa: PLR1730
            self.maximum = value


Cell = list[float]  # one point's running sum, one item: added to in place


class _Shape:
    """The attribute sets every request of one (model, agent, route) counts under, and the
    cells and histograms they add to, found once: hashing an attribute tuple for each add
    cost more than the adds."""

    __slots__ = ("base", "cached", "chunk", "duration", "floors", "input", "output", "own",
                 "tokens")

    def __init__(self, base: Attributes, own: Attributes, tokens: Attributes) -> None:
        self.base = base  # the GenAI client attributes
        self.own = own  # tailfloor's: agent, route
        self.tokens = tokens  # the token counters'
        self.floors: dict[str, Cell] = {}  # the floors counter's, by floor kind
        # Each made with its first value: a point is exported once it has one.
        self.input: Cell | None = None
        self.output: Cell | None = None
        self.cached: Cell | None = None
        self.duration: _Histogram | None = None  # of an attempt without an error
        self.chunk: _Histogram | None = None


def _cell(sums: dict[Attributes, Cell], attributes: Attributes) -> Cell:
    cell = sums.get(attributes)
    if cell is None:
        cell = sums[attributes] = [0]
    return cell


def _histogram(kept: dict[Attributes, _Histogram], attributes: Attributes,
               buckets: int) -> _Histogram:
    point = kept.get(attributes)
    if point is None:
        point = kept[attributes] = _Histogram(buckets)
    return point


class Instruments:
    def __init__(self, upstream: Upstream, *, delta: bool, start_ns: int) -> None:
        self._upstream = upstream
        self._delta = delta
        self._start_ns = start_ns  # cumulative: since the sink started; delta: the last export
        self._sums: dict[str, dict[Attributes, Cell]] = {name: {} for name, _, _ in _COUNTERS}
        self._histograms: dict[str, dict[Attributes, _Histogram]] = {
            _DURATION[0]: {}, _FIRST_CHUNK[0]: {}}
        self._input, self._output, self._cached = (self._sums[name]
                                                   for name in (_INPUT, _OUTPUT, _CACHED))
        self._floors = self._sums["tailfloor.floors"]
        self._durations = self._histograms[_DURATION[0]]
        self._chunks = self._histograms[_FIRST_CHUNK[0]]
        self._shapes: dict[tuple[str, str, str], _Shape] = {}
        self._number_attributes = wire.AttributeCache(7)
        self._histogram_attributes = wire.AttributeCache(9)
        self._number_points: dict[Attributes, bytes] = {}
        self._histogram_points: dict[Attributes, bytes] = {}

    def _add(self, name: str, value: float, attributes: Attributes) -> None:
        _cell(self._sums[name], attributes)[0] += value

    def _shape(self, key: tuple[str, str, str]) -> _Shape:
        model, agent, route = key
        upstream = self._upstream
        provider = upstream.provider or ("anthropic" if route == "messages" else "openai")
        base: Attributes = (
            ("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", provider),
            ("gen_ai.request.model", model), ("server.address", upstream.address),
            ("server.port", upstream.port))
        own: Attributes = (("tailfloor.agent", agent), ("tailfloor.route", route))
        if len(self._shapes) >= 4096:  # bounded by the labels' caps; this is a backstop
            self._shapes.clear()
        found = self._shapes[key] = _Shape(
            base, own, (*base, *own, ("gen_ai.token.modality", "text")))
        return found

    def record(self, report: RequestReport, model: str, agent: str,  # noqa: PLR0915
               prices: PriceList) -> None:
        """``model``, ``agent``: the report's, labelled (the spans need them too);
        ``prices``: the rules' (read once for a batch of reports). One long function: what
        every request adds is inline (each call cost as much as the adds it made)."""
        key = (model, agent, report.route)
        shape = self._shapes.get(key) or self._shape(key)
        own = shape.own
        usage = report.usage
        if usage is not None:
            count = usage.prompt_tokens
            if count:
                cell = shape.input
                if cell is None:
                    cell = shape.input = _cell(self._input, shape.tokens)
                cell[0] += count
            count = usage.completion_tokens
            if count:
                cell = shape.output
                if cell is None:
                    cell = shape.output = _cell(self._output, shape.tokens)
                cell[0] += count
            count = usage.cached_tokens
            if count:
                cell = shape.cached
                if cell is None:
                    cell = shape.cached = _cell(self._cached, shape.tokens)
                cell[0] += count
        attempts = report.attempts
        if len(attempts) == 1 and attempts[0].error is None and attempts[0].broke is None \
                and (attempts[0].status or 0) < 400:  # most requests: one attempt, answered
            # _observed's, without its lookups: the histograms every request adds to.
            attempt = attempts[0]
            point = shape.duration
            if point is None:
                point = shape.duration = _histogram(self._durations, shape.base,
                                                    len(_DURATION_BUCKETS) + 1)
            seconds = report.seconds - attempt.started
            if seconds < 0.0:  # noqa: PLR1730
                seconds = 0.0
            # _Histogram.add's, inline: a call cost as much.
            point.counts[bisect_left(_DURATION_BUCKETS, seconds)] += 1
            point.total += seconds
            if seconds < point.minimum:  # noqa: PLR1730
                point.minimum = seconds
            if seconds > point.maximum:  # noqa: PLR1730
                point.maximum = seconds
            if attempt.first_chunk is not None:
                point = shape.chunk
                if point is None:
                    point = shape.chunk = _histogram(self._chunks, shape.base,
                                                     len(_CHUNK_BUCKETS) + 1)
                seconds = attempt.first_chunk - attempt.started
                point.add(seconds if seconds > 0.0 else 0.0, _CHUNK_BUCKETS)
        elif attempts:
            self._attempts(report, shape.base)
        kind = report.floor_kind
        cell = shape.floors.get(kind)
        if cell is None:
            cell = shape.floors[kind] = _cell(self._floors,
                                              (*own, ("tailfloor.floor.kind", kind)))
        cell[0] += 1
        if report.carried or report.restored or report.overflow is not None \
                or report.compaction is not None or prices.rows:
            self._rarer(report, prices, model, own)

    def _rarer(self, report: RequestReport, prices: PriceList, model: str,
               own: Attributes) -> None:
        """What only some requests add to: floors, recovery, costs."""
        if report.carried:
            self._add("tailfloor.carried.messages", report.carried, own)
        if report.restored:
            self._add("tailfloor.restored.messages", report.restored, own)
        if report.overflow is not None:
            self._add("tailfloor.overflows", 1, (*own, ("tailfloor.overflow", report.overflow)))
        if report.compaction is not None:
            self._add("tailfloor.compactions", 1,
                      (*own, ("tailfloor.compaction", report.compaction)))
        if prices.rows:
            self._cost(report, prices, model, own)

    def _cost(self, report: RequestReport, prices: PriceList, model: str,
              own: Attributes) -> None:
        costs = costs_of(report, prices)
        if costs is not None:
            for kind, dollars in costs.items():
                if dollars:
                    self._add("tailfloor.cost", dollars, (
                        *own, ("gen_ai.request.model", model), ("tailfloor.cost.kind", kind)))

    def _attempts(self, report: RequestReport, base: Attributes) -> None:
        last = len(report.attempts) - 1
        for index, attempt in enumerate(report.attempts):
            seconds = report.seconds - attempt.started if index == last \
                and attempt.error is None else attempt.latency
            status = attempt.status
            error = attempt.error or attempt.broke or (
                str(status) if status is not None and status >= 400 else None)
            self._observed((*base, ("error.type", error)) if error else base, seconds,
                           attempt, base)

    def _observed(self, attributes: Attributes, seconds: float, attempt: Attempt,
                  base: Attributes) -> None:
        """One attempt's duration, under ``attributes`` (with its error, if any), and its
        time to first chunk, under ``base``."""
        _histogram(self._durations, attributes, len(_DURATION_BUCKETS) + 1).add(
            seconds if seconds > 0.0 else 0.0, _DURATION_BUCKETS)
        if attempt.first_chunk is not None:
            first = attempt.first_chunk - attempt.started
            _histogram(self._chunks, base, len(_CHUNK_BUCKETS) + 1).add(
                first if first > 0.0 else 0.0, _CHUNK_BUCKETS)

    @staticmethod
    def _encoded(kept: dict[Attributes, bytes], cache: wire.AttributeCache
                 ) -> Callable[[Attributes], bytes]:
        """A point's attributes encoded, each set once (the points' sets repeat from one
        export to the next; as bounded as the points themselves, and emptied when full)."""
        if len(kept) >= 4096:
            kept.clear()

        def encoded(attributes: Attributes) -> bytes:
            found = kept.get(attributes)
            if found is None:
                found = kept[attributes] = cache.encode(attributes)
            return found

        return encoded

    def collect(self, now_ns: int) -> list[bytes]:
        """Every metric with a point, framed for ScopeMetrics.metrics (delta: what came
        since the last collection, which starts over)."""
        start = self._start_ns
        temporality = wire.DELTA if self._delta else wire.CUMULATIVE
        found: list[bytes] = []
        numbers = self._encoded(self._number_points, self._number_attributes)
        for name, _, _ in _COUNTERS:
            sums = self._sums[name]
            if sums:
                points = [wire.number_point(numbers(attributes), start, now_ns, cell[0])
                          for attributes, cell in sums.items()]
                found.append(wire.delimited(_METRIC, _HEADS[name] + wire.sum_(
                    points, temporality, monotonic=True)))
        histograms = self._encoded(self._histogram_points, self._histogram_attributes)
        for name, _, _, bounds in (_DURATION, _FIRST_CHUNK):
            kept = self._histograms[name]
            if kept:
                points = [wire.histogram_point(
                    histograms(attributes), start, now_ns, h.counts, bounds, total=h.total,
                    minimum=h.minimum, maximum=h.maximum) for attributes, h in kept.items()]
                found.append(wire.delimited(_METRIC, _HEADS[name] + wire.histogram(
                    points, temporality)))
        if self._delta:
            self._start_ns = now_ns
            self._shapes.clear()  # their cells and histograms are the ones cleared here
            for sums in self._sums.values():
                sums.clear()
            for kept in self._histograms.values():
                kept.clear()
        return found

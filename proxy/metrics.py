"""Every Prometheus series tailfloor exports, on a registry the caller owns.

The metric names and label sets are a contract: the Grafana dashboard and the alert rules
query them, so renaming one is a breaking change. Label values are bounded: model and agent
names beyond a cap collapse into ``other`` so a misbehaving client cannot explode cardinality,
and a model name is a label only once vetted (an upstream answered successfully for it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy.logs import redact

__all__ = ["CONTENT_TYPE_LATEST", "BoundedLabel", "CacheFill", "Metrics"]

# A cache's fill as scraped: how to read what it holds now, and its bound.
CacheFill = tuple[Callable[[], float], float]

# Seconds. Latency buckets fine enough to see sub-millisecond proxy overhead.
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25)
SUMMARIZER_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)

OTHER = "other"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


class BoundedLabel:
    """Maps free-form label values (model names, agent ids) onto at most ``cap`` distinct ones.

    ``vetted``: a value becomes a label only once ``admit`` was called for it (a model an
    upstream answered successfully for); until then it is ``other``, so
    junk a client sends neither takes a slot nor reaches ``/metrics``. A value that looks like
    a credential, or is not a plain name, is never admitted.
    """

    def __init__(self, cap: int, *, vetted: bool = False) -> None:
        self._cap = cap
        self._vetted = vetted
        self._seen: set[str] = set()

    @property
    def seen(self) -> frozenset[str] | set[str]:
        """The values that are their own label (read-only to callers)."""
        return self._seen

    def admit(self, value: str | None) -> None:
        if (value and value not in self._seen and len(self._seen) < self._cap
                and _PLAIN_NAME.fullmatch(value) and redact(value) == value):
            self._seen.add(value)

    def __call__(self, value: str | None) -> str:
        if not value:
            return "unknown"
        if value in self._seen:
            return value
        if self._vetted or len(self._seen) >= self._cap or len(value) > 128 \
                or redact(value) != value:
            return OTHER
        self._seen.add(value)
        return value


class Children:
    """Cached label children of one metric: ``labels()`` validates and locks on every call,
    which costs more than the observation itself on the request path."""

    def __init__(self, metric: Counter | Histogram | Gauge) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*values)
        return child


class Metrics:
    """All series, created once per application on an injected registry."""

    def __init__(self, registry: CollectorRegistry | None = None, label_cap: int = 64) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_label = BoundedLabel(label_cap, vetted=True)
        self.agent_label = BoundedLabel(label_cap)
        r = self.registry

        # Proxy core.
        self.requests = Counter(
            "tailfloor_requests_total", "Requests answered, by route, model and HTTP status.",
            ["route", "model", "code"], registry=r)
        self.tokens = Counter(
            "tailfloor_tokens_total",
            "Tokens reported by the upstream (type: input|output|cached_input|reasoning; "
            "route: chat_completions|responses|messages, the API dialect).",
            ["model", "agent", "type", "route"], registry=r)
        self.request_duration = Histogram(
            "tailfloor_request_duration_seconds", "Whole request duration as the client sees it.",
            ["route", "model"], buckets=REQUEST_BUCKETS, registry=r)
        self.time_to_first_token = Histogram(
            "tailfloor_time_to_first_token_seconds",
            "Time from the client's request to the first streamed event relayed.",
            ["model"], buckets=TTFT_BUCKETS, registry=r)
        self.overhead = Histogram(
            "tailfloor_overhead_seconds",
            "Time spent inside the proxy itself, excluding waiting for the upstream.",
            ["route"], buckets=OVERHEAD_BUCKETS, registry=r)
        self.in_flight = Gauge(
            "tailfloor_in_flight_requests", "Requests currently being proxied.", registry=r)
        self.upstream_errors = Counter(
            "tailfloor_upstream_errors_total",
            "Upstream failures (kind: connect|timeout|mid_stream|error_event|"
            "stream_options_rejected).",
            ["kind"], registry=r)
        self.client_disconnects = Counter(
            "tailfloor_client_disconnects_total",
            "Clients that went away before the response was complete.", registry=r)
        self.rejected = Counter(
            "tailfloor_rejected_requests_total",
            "Requests refused before reaching the upstream (reason: invalid_json|too_large|...).",
            ["reason"], registry=r)
        self.watcher_up = Gauge(
            "tailfloor_watcher_up",
            "1 while the transcript watcher runs, 0 while it is down (restarting).", registry=r)
        self.watcher_restarts = Counter(
            "tailfloor_watcher_restarts_total",
            "Transcript watcher restarts (reason: error|ended|roots).", ["reason"], registry=r)
        self.dialect_passthrough = Counter(
            "tailfloor_dialect_passthrough_total",
            "Responses and Messages requests passed on untouched because they do not hold "
            "the conversation (reason: server_state|message_thread|unsupported_item).",
            ["route", "reason"], registry=r)
        self.large_answers = Counter(
            "tailfloor_large_answers_total",
            "Complete (non-streaming) answers over the size limit, passed on as they arrived "
            "without reading their usage.", registry=r)
        self.store_errors = Counter(
            "tailfloor_store_errors_total",
            "Store operations that failed (store: sqlite, the local compaction store; redis, the "
            "shared store; kind: failed, or forged for a shared value whose signature does not "
            "check); the request went on.",
            ["store", "kind"], registry=r)
        self.internal_errors = Counter(
            "tailfloor_internal_errors_total",
            "Requests answered 500 because of an error nothing else expected (logged).",
            registry=r)
        self.keepalives = Counter(
            "tailfloor_stream_keepalives_total",
            "SSE comment keep-alives written into idle streams.", registry=r)
        self.usage_missing = Counter(
            "tailfloor_usage_missing_total",
            "Chat responses that ended without a usage object.", ["route"], registry=r)

        # Transcripts.
        self.sessions = Gauge(
            "tailfloor_sessions", "Agent sessions tracked, by transcript source.",
            ["source"], registry=r)
        self.transcript_lines = Counter(
            "tailfloor_transcript_lines_total", "Transcript lines or rows read.",
            ["source"], registry=r)
        self.transcript_errors = Counter(
            "tailfloor_transcript_errors_total",
            "Transcript lines, rows or files that could not be read, by kind.",
            ["kind"], registry=r)
        self.transcript_lag = Histogram(
            "tailfloor_transcript_lag_seconds",
            "From a transcript change on disk to the session view being updated.",
            buckets=LAG_BUCKETS, registry=r)

        # Floor enforcement.
        self.identification_wait = Histogram(
            "tailfloor_identification_wait_seconds",
            "Time a request that runs ahead of its transcript waited for the watcher "
            "(outcome: identified|unidentified|timeout).",
            ["outcome"], buckets=WAIT_BUCKETS, registry=r)
        self.rewrites = Counter(
            "tailfloor_rewrites_total",
            "Chat requests by what the floor did (kind: floor|carry|shadow|none).",
            ["kind"], registry=r)
        self.tail_messages_injected = Counter(
            "tailfloor_tail_messages_injected_total",
            "Raw transcript messages put back into requests.", registry=r)
        self.tail_tokens_injected = Counter(
            "tailfloor_tail_tokens_injected_total",
            "Estimated tokens of the raw messages put back into requests.", registry=r)
        self.identification = Counter(
            "tailfloor_identification_total",
            "How requests were matched to a session, or why they were not.",
            ["method"], registry=r)
        self.floor_capped = Counter(
            "tailfloor_floor_capped_total",
            "Rewrites that dropped added messages to fit the context window.", registry=r)
        self._pin_series(r)
        self._cache_series(r)
        self.rules_reloads = Counter(
            "tailfloor_rules_reloads_total", "Rules reloads (outcome: ok|error).",
            ["outcome"], registry=r)

        # Overflow recovery and compaction.
        self.overflow = Counter(
            "tailfloor_overflow_total",
            "Context overflows (outcome: recovered|clamped|failed|passthrough|mid_stream|"
            "silent).",
            ["outcome"], registry=r)
        self.output_lowered = Counter(
            "tailfloor_output_lowered_total",
            "Requests sent with their output limit lowered to fit the window "
            "(trigger: preflight|overflow).",
            ["trigger"], registry=r)
        self.compactions = Counter(
            "tailfloor_compactions_total",
            "Compactions applied (trigger: overflow|preflight|reused).",
            ["trigger"], registry=r)
        self.summarizer_duration = Histogram(
            "tailfloor_summarizer_duration_seconds", "Summarizer call duration.",
            buckets=SUMMARIZER_BUCKETS, registry=r)
        self.summarizer_tokens = Counter(
            "tailfloor_summarizer_tokens_total", "Tokens used by summarizer calls (type).",
            ["type"], registry=r)
        self.summarizer_failures = Counter(
            "tailfloor_summarizer_failures_total",
            "Summarizer calls that failed or timed out (fallback used).", registry=r)
        self.tokens_removed = Counter(
            "tailfloor_tokens_removed_total",
            "Estimated tokens removed from requests by compaction.", registry=r)
        # OTLP export (proxy/telemetry/) and dollars (the rules' [[prices]]).
        self.otlp_dropped = Counter(
            "tailfloor_otlp_dropped_total",
            "OTLP export dropped (signal: traces counts spans and metrics exports a collector "
            "did not take; reports counts requests not described, the queue being full; "
            "content counts captured messages left out, past the bound of bodies waiting).",
            ["signal"], registry=r)
        self.cost = Counter(
            "tailfloor_cost_usd_total",
            "Dollars by the rules' [[prices]] (kind: request = the agent's own tokens, floor = "
            "the tokens the floor added, summary = summarizer calls, saved = what compaction "
            "took out, estimated).", ["agent", "model", "kind"], registry=r)
        self.cost_unpriced = Counter(
            "tailfloor_cost_unpriced_total",
            "Answers with token usage whose model no [[prices]] row names: not priced.",
            ["model"], registry=r)

        self._shortcuts()

    def _shortcuts(self) -> None:
        """The hot path's children, label values in declaration order."""
        self.requests_by = Children(self.requests)
        self.tokens_by = Children(self.tokens)
        self.duration_by = Children(self.request_duration)
        self.ttft_by = Children(self.time_to_first_token)
        self.overhead_by = Children(self.overhead)
        self.identification_by = Children(self.identification)
        self.rewrites_by = Children(self.rewrites)

    def _pin_series(self, r: CollectorRegistry) -> None:
        self.indexing_passthrough = Counter(
            "tailfloor_indexing_passthrough_total",
            "Chat requests passed on untouched because the first transcript scan was still "
            "running.", ["route"], registry=r)
        self.busy_passthrough = Counter(
            "tailfloor_floor_busy_passthrough_total",
            "Chat requests passed on untouched because their floor decision had not started "
            "within --floor-wait-ms (x-tailfloor: none; reason=busy).", ["route"], registry=r)
        self.carries = Counter(
            "tailfloor_carry_total", "New sessions and resets: carried (the previous "
            "session's tail went in) or clean_slate (the user's first message asked for "
            "none).", ["outcome"], registry=r)
        self.pins = Gauge(
            "tailfloor_pins", "Pins in force in the agent's lineage of its latest request "
            "that holds any (rules: pin_patterns).", ["agent"], registry=r)
        self.pins_inserted = Counter(
            "tailfloor_pins_inserted_total", "Pinned messages tailfloor put back into a "
            "request that no longer held them raw.", ["agent"], registry=r)
        self.pins_dropped = Counter(
            "tailfloor_pins_dropped_total", "Pins left out of a request: past max_pinned, "
            "or past pinned_token_budget or the window.", registry=r)

    def _cache_series(self, r: CollectorRegistry) -> None:
        self.cache_held = Gauge(
            "tailfloor_cache_held", "What the bounded memory kept between requests holds, "
            "read at each scrape (cache: rendered_bytes = memory the kept renderings hold, "
            "their JSON and a row each; rendered = kept renderings; rendered_decoded_bytes = "
            "those of long tails held decoded, reckoned from their JSON; "
            "served_sessions and served_entries = unpacked session windows; token_counts = "
            "remembered message counts: these by --session-cache-bytes; inspector_bytes = "
            "the inspector's kept requests, by --inspect-memory-bytes).", ["cache"],
            registry=r)
        self.cache_bound = Gauge(
            "tailfloor_cache_bound", "The bound of each tailfloor_cache_held.", ["cache"],
            registry=r)

    def report_caches(self, caches: Mapping[str, CacheFill]) -> None:
        """Each cache's fill, read when scraped: no work on the request path."""
        for name, (held, bound) in caches.items():
            self.cache_held.labels(cache=name).set_function(held)
            self.cache_bound.labels(cache=name).set(bound)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

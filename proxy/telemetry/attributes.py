"""A finished request's report as the spans that describe it: names, kinds, times and
attributes, per the GenAI semantic conventions (semantic-conventions-genai v0.1.0,
client-inference.md) plus tailfloor's own ``tailfloor.*``.

Only counts, names and verdicts: never a message, a header or a key. A model or agent name
goes out only as the Prometheus labels would show it (``label``: the same vetting, see
proxy/metrics.py). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from proxy.report import Attempt, RequestReport

__all__ = ["SpanPlan", "Upstream", "plan_spans", "provider_of"]

Value = str | bool | int | float | tuple[str, ...]
Label = Callable[[str | None], str]

ROUTES = {"chat_completions": "/v1/chat/completions", "responses": "/v1/responses",
          "messages": "/v1/messages"}
# Well-known gen_ai.provider.name values, by the upstream's host.
_HOSTS = (("openai.azure.com", "azure.ai.openai"), ("openai.com", "openai"),
          ("anthropic.com", "anthropic"), ("googleapis.com", "gcp.gemini"),
          ("mistral.ai", "mistral_ai"), ("groq.com", "groq"), ("deepseek.com", "deepseek"),
          ("x.ai", "x_ai"), ("perplexity.ai", "perplexity"), ("cohere.com", "cohere"),
          ("amazonaws.com", "aws.bedrock"), ("openrouter.ai", "openrouter"))


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where attempts go: the address and port a span names, and the provider."""

    address: str
    port: int
    provider: str | None  # None: by the route's dialect

    @classmethod
    def of(cls, url: str) -> Upstream:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        return cls(host, port, provider_of(host))


@dataclass(frozen=True, slots=True)
class SpanPlan:
    """One span to make: times are epoch seconds; ``span_id`` is set when the request path
    already sent it (an attempt's or the summarizer's traceparent)."""

    name: str
    kind: Literal["server", "client"]
    start: float
    end: float
    attributes: dict[str, Value] = field(default_factory=dict)
    error: str | None = None
    span_id: int | None = None


def provider_of(host: str) -> str | None:
    host = host.lower()
    for suffix, name in _HOSTS:
        if host == suffix or host.endswith("." + suffix):
            return name
    return None


def plan_spans(report: RequestReport, upstream: Upstream, label: Label,
               agent_label: Label, span_ids: Callable[[str], int], *,
               response_label: Label | None = None) -> list[SpanPlan]:
    """The server span first, then each attempt's client span and the summarizer's.
    ``response_label``: how ``gen_ai.response.model`` is vetted (None: left out)."""
    at = report.at
    plans = [_server(report, agent_label)]
    model = label(report.model)
    provider = upstream.provider or ("anthropic" if report.route == "messages" else "openai")
    last = len(report.attempts) - 1
    for index, attempt in enumerate(report.attempts):
        start = at + attempt.started
        # The last attempt's answer is relayed to its end; an earlier one ended at its error.
        end = at + report.seconds if index == last and attempt.error is None \
            else start + attempt.latency
        attributes = _chat(model, provider, upstream)
        attributes["gen_ai.request.stream"] = report.stream
        attributes.update(_attempt(report, attempt, index == last))
        if index == last and report.response_model is not None \
                and response_label is not None and attempt.error is None:
            attributes["gen_ai.response.model"] = response_label(report.response_model)
        error = attempt.error or (f"{attempt.status}" if attempt.status is not None
                                  and attempt.status >= 400 else None)
        if error is not None:
            attributes["error.type"] = error
        plans.append(SpanPlan(
            f"chat {model}", "client", start, max(end, start), attributes, error=error,
            span_id=span_ids(attempt.traceparent) if attempt.traceparent else None))
    made = report.summary
    if made is not None:
        summary_model = label(made.model)
        attributes = _chat(summary_model, provider, upstream)
        attributes["tailfloor.summarizer"] = True
        if made.failure is None:
            attributes["gen_ai.usage.input_tokens"] = made.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = made.completion_tokens
        else:
            attributes["error.type"] = made.failure
        start = at + made.started
        plans.append(SpanPlan(f"chat {summary_model}", "client", start, start + made.seconds,
                              attributes, error=made.failure,
                              span_id=span_ids(made.traceparent) if made.traceparent
                              else None))
    return plans


def _server(report: RequestReport, agent_label: Label) -> SpanPlan:
    route = ROUTES.get(report.route, report.route)
    attributes: dict[str, Value] = {
        "http.request.method": "POST", "http.route": route,
        "http.response.status_code": report.status,
        "tailfloor.proxy_seconds": round(report.proxy_seconds, 6),
        "tailfloor.verdict": report.verdict.split(";", 1)[0],
        "tailfloor.floor.kind": report.floor_kind,
        "tailfloor.agent": agent_label(report.agent or "none"),
    }
    optional: dict[str, Value | None] = {
        "tailfloor.floor.reason": report.floor_reason,
        "tailfloor.identification.method": report.method,
        "tailfloor.floor.restored": report.restored or None,
        "tailfloor.floor.carried": report.carried or None,
        "tailfloor.floor.carried_from": report.carried_from,
        "tailfloor.floor.added_tokens": report.added_tokens or None,
        "tailfloor.compaction": report.compaction,
        "tailfloor.compaction.tokens_removed": report.tokens_removed or None,
        "tailfloor.overflow": report.overflow,
        "gen_ai.conversation.id": report.named_session,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    error = f"{report.status}" if report.status >= 500 else None
    if error is not None:
        attributes["error.type"] = error
    return SpanPlan(f"POST {route}", "server", report.at, report.at + report.seconds,
                    attributes, error=error)


def _chat(model: str, provider: str, upstream: Upstream) -> dict[str, Value]:
    return {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
            "gen_ai.request.model": model, "server.address": upstream.address,
            "server.port": upstream.port}


def _attempt(report: RequestReport, attempt: Attempt, last: bool) -> dict[str, Value]:
    found: dict[str, Value] = {"tailfloor.retry": attempt.number}
    if attempt.status is not None:
        found["http.response.status_code"] = attempt.status
    if attempt.compacted:
        found["gen_ai.conversation.compacted"] = True
    if report.named_session is not None:
        found["gen_ai.conversation.id"] = report.named_session
    if attempt.first_chunk is not None:
        found["gen_ai.response.time_to_first_chunk"] = round(
            attempt.first_chunk - attempt.started, 6)
    if not last or attempt.error is not None:
        return found
    usage = report.usage
    if usage is not None and report.status < 400:
        for key, value in (("gen_ai.usage.input_tokens", usage.prompt_tokens),
                           ("gen_ai.usage.output_tokens", usage.completion_tokens),
                           ("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens),
                           ("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens)):
            if value is not None:
                found[key] = value
    if report.finish_reason is not None:
        found["gen_ai.response.finish_reasons"] = (report.finish_reason,)
    return found

"""A finished request's report as the spans that describe it: names, kinds, times and
attributes, per the GenAI semantic conventions (semantic-conventions-genai v0.1.0,
client-inference.md) plus tailfloor's own ``tailfloor.*``.

Only counts, names and verdicts: never a message, a header or a key. A model or agent name
goes out only as the Prometheus labels would show it (``label``: the same vetting, see
proxy/metrics.py). Pure: no I/O.

Each span is made of three parts, so the telemetry thread can encode most of it once
(spans.py): a ``*_key`` (the few report values the rest depends on, which repeat from one
request to the next), the ``*_fixed`` part made from that key alone (name, error, most
attributes), and the ``*_numbers`` (seconds, token and message counts: new every request).
``plan_spans`` puts them together: what the spans are, in one place.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

from proxy.logs import redact
from proxy.report import Attempt, RequestReport

__all__ = ["ATTEMPT_NUMBERS", "SERVER_NUMBERS", "Fixed", "SpanPlan", "Upstream", "attempt_fixed",
           "attempt_key", "attempt_numbers", "conversation_id", "plan_spans", "provider_of",
           "server_fixed", "server_key", "server_numbers"]

Value = str | bool | int | float | tuple[str, ...]
Label = Callable[[str | None], str]
Key = tuple[Any, ...]

# A session id as agents make them: a UUID, OpenClaw's ``agent:main:main``, a path-like key.
_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,127}")
# A key or token of no known prefix (32 hex digits, base64): a long run without a
# separator. Agents' ids break theirs up (a UUID's groups are at most 12 long).
_UNBROKEN = re.compile(r"[A-Za-z0-9]{24}")

ROUTES = {"chat_completions": "/v1/chat/completions", "responses": "/v1/responses",
          "messages": "/v1/messages"}
# Well-known gen_ai.provider.name values, by the upstream's host.
_HOSTS = (("openai.azure.com", "azure.ai.openai"), ("openai.com", "openai"),
          ("anthropic.com", "anthropic"), ("aiplatform.googleapis.com", "gcp.vertex_ai"),
          ("googleapis.com", "gcp.gemini"),
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


class Fixed(NamedTuple):
    """What a span is but its ids, times and numbers."""

    name: str
    attributes: dict[str, Value]
    error: str | None


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
    fixed = server_fixed(server_key(report, agent_label(report.agent or "none")))
    plans = [SpanPlan(fixed.name, "server", at, at + report.seconds,
                      {**fixed.attributes, **_named(SERVER_NUMBERS, server_numbers(report))},
                      fixed.error)]
    model = label(report.model)
    last = len(report.attempts) - 1
    for index, attempt in enumerate(report.attempts):
        start = at + attempt.started
        # The last attempt's answer is relayed to its end; an earlier one ended at its error.
        end = at + report.seconds if index == last and attempt.error is None \
            else start + attempt.latency
        key = attempt_key(report, attempt, index == last, model, response_label)
        fixed = attempt_fixed(key, upstream)
        plans.append(SpanPlan(
            fixed.name, "client", start, max(end, start),
            {**fixed.attributes,
             **_named(ATTEMPT_NUMBERS, attempt_numbers(report, attempt, key))},
            error=fixed.error,
            span_id=span_ids(attempt.traceparent) if attempt.traceparent else None))
    made = report.summary
    if made is not None:
        summary_model = label(made.model)
        attributes = _chat(summary_model, _provider(report.route, upstream), upstream)
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


def conversation_id(claimed: str | None) -> str | None:
    """``gen_ai.conversation.id``: the session id the agent named, when it is a plain id
    that looks like no credential (a client may put anything in a session header or a
    ``prompt_cache_key``): no known key prefix and no run of 24 letters and digits; else
    left out."""
    if claimed is None or not _PLAIN_ID.fullmatch(claimed) or _UNBROKEN.search(claimed) \
            or redact(claimed) != claimed:
        return None
    return claimed


def server_key(report: RequestReport, agent: str) -> Key:
    """``agent``: the report's, labelled."""
    attempts = report.attempts
    return (report.route, report.status, report.verdict.split(";", 1)[0], report.floor_kind,
            agent, report.floor_reason, report.method,
            report.carried_from, report.compaction, report.overflow,
            conversation_id(report.named_session), attempts[-1].broke if attempts else None)


def server_fixed(key: Key) -> Fixed:
    (route, status, verdict, floor_kind, agent, floor_reason, method, carried_from,
     compaction, overflow, session, broke) = key
    path: str = ROUTES.get(route) or route
    attributes: dict[str, Value] = {
        "http.request.method": "POST", "http.route": path,
        "http.response.status_code": status, "tailfloor.verdict": verdict,
        "tailfloor.floor.kind": floor_kind, "tailfloor.agent": agent,
    }
    optional: dict[str, Value | None] = {
        "tailfloor.floor.reason": floor_reason,
        "tailfloor.identification.method": method,
        "tailfloor.floor.carried_from": carried_from,
        "tailfloor.compaction": compaction,
        "tailfloor.overflow": overflow,
        "gen_ai.conversation.id": session,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    # A streamed answer that broke off is the client's failure too, whatever its status
    # said (the HTTP conventions: an error reading the body sets the span's status).
    error = f"{status}" if status >= 500 else broke
    if error is not None:
        attributes["error.type"] = error
    return Fixed(f"POST {path}", attributes, error)


# The numbers' names, in the order ``*_numbers`` give their values (None: left out).
SERVER_NUMBERS = ("tailfloor.proxy_seconds", "tailfloor.floor.restored",
                  "tailfloor.floor.carried", "tailfloor.floor.added_tokens",
                  "tailfloor.compaction.tokens_removed")
ATTEMPT_NUMBERS = ("gen_ai.response.time_to_first_chunk", "gen_ai.usage.input_tokens",
                   "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens",
                   "gen_ai.usage.reasoning.output_tokens")
Numbers = tuple[float | None, ...]


def server_numbers(report: RequestReport) -> Numbers:
    # Seconds as they are: a double is eight bytes however it is rounded.
    return (report.proxy_seconds, report.restored or None, report.carried or None,
            report.added_tokens or None, report.tokens_removed or None)


def attempt_key(report: RequestReport, attempt: Attempt, last: bool, model: str,
                response_label: Label | None) -> Key:
    """``model``: the request's, labelled. Its last item: the answer's usage is counted
    (the last attempt, answered; ``attempt_numbers`` reads it)."""
    ended = last and attempt.error is None  # this attempt's answer is the client's
    response = response_label(report.response_model) if ended and response_label \
        is not None and report.response_model is not None else None
    return (model, report.route, report.stream, attempt.number, attempt.status,
            attempt.compacted, conversation_id(report.named_session),
            attempt.error or attempt.broke,
            report.finish_reason if ended else None, response,
            ended and report.usage is not None and report.status < 400)


def attempt_fixed(key: Key, upstream: Upstream) -> Fixed:
    (model, route, stream, number, status, compacted, session, error_kind, finish,
     response, _) = key
    attributes = _chat(model, _provider(route, upstream), upstream)
    attributes["gen_ai.request.stream"] = stream
    attributes["tailfloor.retry"] = number
    if status is not None:
        attributes["http.response.status_code"] = status
    if compacted:
        attributes["gen_ai.conversation.compacted"] = True
    if session is not None:
        attributes["gen_ai.conversation.id"] = session
    if finish is not None:
        attributes["gen_ai.response.finish_reasons"] = (finish,)
    if response is not None:
        attributes["gen_ai.response.model"] = response
    error = error_kind or (f"{status}" if status is not None and status >= 400 else None)
    if error is not None:
        attributes["error.type"] = error
    return Fixed(f"chat {model}", attributes, error)


def attempt_numbers(report: RequestReport, attempt: Attempt, key: Key) -> Numbers:
    first = attempt.first_chunk - attempt.started if attempt.first_chunk is not None else None
    usage = report.usage
    if not key[-1] or usage is None:
        return (first, None, None, None, None)
    return (first, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
            usage.reasoning_tokens)


def _named(names: tuple[str, ...], values: Numbers) -> dict[str, Value]:
    return {name: value for name, value in zip(names, values, strict=True)
            if value is not None}


def _provider(route: str, upstream: Upstream) -> str:
    return upstream.provider or ("anthropic" if route == "messages" else "openai")


def _chat(model: str, provider: str, upstream: Upstream) -> dict[str, Value]:
    return {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
            "gen_ai.request.model": model, "server.address": upstream.address,
            "server.port": upstream.port}

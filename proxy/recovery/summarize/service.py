"""Summaries for overflow recovery: the summarizer configured from the request's policy, and
a rest for a summarizer that keeps failing.

A summarizer that is down or hangs would make every overflow wait for its timeout before the
fallback; after a failure of the service itself (timeout, transport, HTTP status) the
summarizing model is left alone for a while and the fallback is used at once. Failures that
belong to one request (material too large, an unusable answer) do not count. Every attempt
is returned as a ``SummaryAttempt`` for the caller to record.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from proxy.facts.learned import BoundedMap
from proxy.policy.records import ModelSpec
from proxy.recovery.outcome import SummaryAttempt
from proxy.recovery.request import RecoveryRequest
from proxy.recovery.summarize.prompt import TokenField, prompt_overhead
from proxy.recovery.summarize.summarizer import (
    Summarizer,
    SummarizerConfig,
    SummarizerError,
    SummarizerTransport,
)
from proxy.recovery.summarize.transport import (
    DialectSummaryTransport,
    UpstreamSummaryTransport,
    summarizer_headers,
)
from proxy.telemetry.tracecontext import TraceContext
from proxy.tokens import TokenCounter, with_margin

__all__ = ["REST_SECONDS", "Summaries"]

REST_SECONDS = 60.0
_SERVICE_FAILURES = frozenset({"timeout", "transport", "status"})
_DETAIL = 200


class Summaries:
    def __init__(self, transport: SummarizerTransport, tokens: TokenCounter,
                 offload: Callable[..., Awaitable[Any]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.transport = transport
        self._tokens = tokens
        self._offload = offload
        self._clock = clock
        self._resting: BoundedMap[str, float] = BoundedMap(256)  # model -> rest until

    async def make(self, request: RecoveryRequest, material: list[dict[str, Any]], *,
                   previous: str | None, model: ModelSpec, window: int,
                   headers: Mapping[str, str]) -> tuple[str | None, SummaryAttempt]:
        """A summary of ``material`` updating ``previous`` by the summarizing model (table
        row ``model``, window ``window``), or None and the failure."""
        policy, body = request.policy, request.chat.body
        name = policy.summary_model or request.chat.model
        if (self._resting.get(name) or 0.0) > self._clock():
            return None, SummaryAttempt(name, 0.0, failure="resting",
                                        detail=f"it failed less than {REST_SECONDS:.0f} s ago")
        token_field: TokenField = ("max_tokens" if "max_tokens" in body
                                   and "max_completion_tokens" not in body
                                   else "max_completion_tokens")
        # This summary's span, the parent of its calls' (telemetry builds it from the
        # report with this id).
        traceparent = request.trace.child() if request.trace is not None else None
        started = time.perf_counter()
        try:
            def count(message: dict[str, Any]) -> int:
                return with_margin(self._tokens.message(message, model.encoding), model.margin)

            config = SummarizerConfig(
                context_window=window, max_output_tokens=request.summary_tokens,
                timeout=policy.summarizer_timeout, call_timeout=policy.summarizer_timeout,
                prompt_overhead_tokens=prompt_overhead(count), token_field=token_field)
            transport: SummarizerTransport = self.transport
            dialect = request.chat.dialect
            if dialect is not None and isinstance(transport, UpstreamSummaryTransport):
                transport = DialectSummaryTransport(transport, dialect)
            summarizer = Summarizer(transport, config, count, offload=self._offload)
            result = await summarizer.summarize(material, model=name,
                                                headers=_traced(summarizer_headers(headers),
                                                                request.trace, traceparent),
                                                previous_summary=previous)
        except ValueError as exc:  # a window too small for any summarizer call
            return None, SummaryAttempt(name, time.perf_counter() - started,
                                        failure="too_large", detail=str(exc)[:_DETAIL],
                                        began=started)
        except SummarizerError as exc:
            if exc.kind in _SERVICE_FAILURES:
                self._resting.put(name, self._clock() + REST_SECONDS)
            return None, SummaryAttempt(name, time.perf_counter() - started,
                                        failure=exc.kind, detail=exc.detail[:_DETAIL],
                                        began=started, traceparent=traceparent)
        return result.text, SummaryAttempt(name, time.perf_counter() - started,
                                           result.prompt_tokens, result.completion_tokens,
                                           began=started, traceparent=traceparent)


def _traced(headers: dict[str, str], trace: TraceContext | None,
            traceparent: str | None) -> dict[str, str]:
    """The summarizer's headers with its own span's ``traceparent`` (spans are exported)
    in place of the client's; the client's ``tracestate`` is dropped when tailfloor started
    the trace (it belonged to a context not kept, as on the request's own attempts)."""
    if trace is None or traceparent is None:
        return headers
    drop = ("traceparent",) if trace.parent_id is not None else ("traceparent", "tracestate")
    out = {k: v for k, v in headers.items() if k.lower() not in drop}
    out["traceparent"] = traceparent
    return out

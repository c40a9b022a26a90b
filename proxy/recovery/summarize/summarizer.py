"""Make a summary with the upstream model, chunk by chunk, through a one-method transport seam.

The network call is the transport's job (the proxy's upstream client, with the client's own
Authorization); this module builds the bodies, bounds the time, reads the answers and carries
the summary of one chunk into the next ("update the previous summary"), so a conversation far
larger than the summarizer's own window still ends as one summary.

Failures are typed: :class:`SummarizerError` with a ``kind`` the caller counts and logs
(``timeout``, ``status``, ``malformed``, ``transport``, ``too_large``). The caller then falls
back to dropping the oldest messages; it never turns a summarizer failure into a 500.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.recovery.summarize.chunks import CountTokens, plan_chunks
from proxy.recovery.summarize.prompt import (
    TokenField,
    build_request,
    clip_text,
    readable_text,
    serialize_messages,
)
from proxy.recovery.summarize.response import SummaryAnswer, parse_summary_response

__all__ = [
    "Summarizer",
    "SummarizerConfig",
    "SummarizerError",
    "SummarizerTransport",
    "SummaryResult",
]

_ERROR_BODY_KEEP = 4096


class SummarizerTransport(Protocol):
    # The timeout is part of the seam on purpose: the transport hands it to its HTTP client's
    # per-request timeout, which also covers connecting.
    async def complete(
        self, body: bytes, headers: Mapping[str, str], timeout: float  # noqa: ASYNC109
    ) -> tuple[int, bytes]:
        """POST the body to the upstream's chat completions; return (status, body bytes)."""
        ...


class SummarizerError(Exception):
    """A summary could not be made. ``kind``: timeout | status | malformed | transport |
    too_large. ``status`` and ``body`` are set for ``status`` (the upstream's answer)."""

    def __init__(self, kind: str, detail: str, status: int | None = None,
                 body: bytes = b"", calls: int = 0) -> None:
        super().__init__(f"summarizer {kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.status = status
        self.body = body[:_ERROR_BODY_KEEP]
        self.calls = calls


@dataclass(frozen=True, slots=True)
class SummarizerConfig:
    context_window: int  # of the summarizing model
    max_output_tokens: int = 4096
    timeout: float = 120.0  # whole summary, all calls
    call_timeout: float = 90.0
    max_calls: int = 8
    prompt_overhead_tokens: int = 1024  # system prompt, instructions, tags
    tool_result_chars: int = 2000
    token_field: TokenField = "max_completion_tokens"

    def __post_init__(self) -> None:
        if self.max_output_tokens <= 0 or self.max_calls <= 0 or self.timeout <= 0:
            raise ValueError("max_output_tokens, max_calls and timeout must be positive")
        if self.chunk_budget(self.max_output_tokens) <= 0:
            raise ValueError(
                f"context_window {self.context_window} leaves no room for conversation after "
                f"{self.max_output_tokens} output tokens, a carried summary of the same size and "
                f"{self.prompt_overhead_tokens} prompt tokens")

    def chunk_budget(self, carried_summary_tokens: int) -> int:
        """Conversation tokens one call may hold next to the output and a carried summary."""
        return (self.context_window - self.max_output_tokens - self.prompt_overhead_tokens
                - max(carried_summary_tokens, self.max_output_tokens))


@dataclass(frozen=True, slots=True)
class SummaryResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    duration: float  # seconds, all calls
    calls: int
    truncated: bool  # some call stopped at the output bound


def _as_read(message: dict[str, Any], tool_chars: int) -> dict[str, Any]:
    """The message as the summarizer will read it: tool results clipped, so chunks are sized
    by what is sent rather than by outputs that will be cut anyway."""
    if message.get("role") not in ("tool", "function"):
        return message
    text = readable_text(message.get("content"))
    if len(text) <= tool_chars:
        return message
    return {**message, "content": clip_text(text, tool_chars)}


def _encode(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # lone surrogates from a request parsed by the stdlib json module
        return json.dumps(body).encode()


async def _in_place(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Summarizer:
    """Summarizes OpenAI messages with one call per chunk, each chunk updating the last summary.

    Planning the chunks counts every message and serializing a chunk is as long as the
    chunk: both go through ``offload`` (the proxy's worker pool), the calls stay on the loop.
    """

    def __init__(
        self,
        transport: SummarizerTransport,
        config: SummarizerConfig,
        count_tokens: CountTokens,
        clock: Callable[[], float] = time.monotonic,
        offload: Callable[..., Awaitable[Any]] = _in_place,
    ) -> None:
        self._transport = transport
        self._config = config
        self._count = count_tokens
        self._clock = clock
        self._offload = offload

    async def summarize(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        model: str,
        headers: Mapping[str, str],
        previous_summary: str | None = None,
    ) -> SummaryResult:
        """One summary of ``messages`` (updating ``previous_summary`` when given)."""
        config = self._config
        carried = self._count({"role": "user", "content": previous_summary or ""})
        budget = config.chunk_budget(carried)
        if budget <= 0:
            raise SummarizerError("too_large", f"previous summary of {carried} tokens leaves no "
                                  "room in the summarizer's window")
        tool_chars = config.tool_result_chars
        chunks = await self._offload(
            plan_chunks, messages, budget, lambda m: self._count(_as_read(m, tool_chars)))
        if not chunks:
            if previous_summary is None:
                raise SummarizerError("too_large", "nothing to summarize")
            return SummaryResult(previous_summary, 0, 0, 0.0, 0, False)
        if len(chunks) > config.max_calls:
            raise SummarizerError("too_large", f"{len(chunks)} chunks needed, at most "
                                  f"{config.max_calls} calls allowed")
        # the body is ours: the client's own content headers must not describe it
        call_headers = {k: v for k, v in headers.items()
                        if k.lower() not in ("content-type", "content-length")}
        call_headers["content-type"] = "application/json"
        started = self._clock()
        deadline = started + config.timeout
        summary = previous_summary
        text = ""
        prompt_tokens = completion_tokens = calls = 0
        truncated = False
        for chunk in chunks:
            # a single message above the budget is clipped to fit rather than overflow the call
            text_chars = None
            if chunk.tokens > budget:
                text_chars = max(1000, budget * 3 // (chunk.end - chunk.start))
            body = await self._offload(self._body, messages[chunk.start:chunk.end], model,
                                       summary, text_chars)
            answer = await self._call(body, call_headers, deadline, calls)
            calls += 1
            summary = text = answer.text
            prompt_tokens += answer.prompt_tokens
            completion_tokens += answer.completion_tokens
            truncated = truncated or answer.finish_reason == "length"
        return SummaryResult(text, prompt_tokens, completion_tokens,
                             self._clock() - started, calls, truncated)

    def _body(self, chunk: Sequence[dict[str, Any]], model: str, summary: str | None,
              text_chars: int | None) -> bytes:
        config = self._config
        conversation = serialize_messages(chunk, config.tool_result_chars,
                                          text_chars=text_chars)
        return _encode(build_request(conversation, model, config.max_output_tokens, summary,
                                     config.token_field))

    async def _call(self, body: bytes, headers: Mapping[str, str], deadline: float,
                    calls_before: int) -> SummaryAnswer:
        remaining = deadline - self._clock()
        calls = calls_before + 1
        if remaining <= 0:
            raise SummarizerError("timeout", "no time left for the next chunk", calls=calls_before)
        timeout = min(self._config.call_timeout, remaining)
        try:
            # the transport gets the timeout too; this bound holds even if it ignores it
            async with asyncio.timeout(timeout):
                status, answer = await self._transport.complete(body, headers, timeout)
        except TimeoutError as exc:
            raise SummarizerError("timeout", f"no answer within {timeout:.1f}s",
                                  calls=calls) from exc
        except Exception as exc:  # the transport's own errors (connection refused, reset...)
            raise SummarizerError("transport", f"{type(exc).__name__}: {exc}",
                                  calls=calls) from exc
        if status != 200:
            preview = answer[:200].decode("utf-8", errors="replace")
            raise SummarizerError("status", f"HTTP {status}: {preview}", status=status,
                                  body=answer, calls=calls)
        try:
            return parse_summary_response(answer)
        except ValueError as exc:
            raise SummarizerError("malformed", str(exc), status=status, body=answer,
                                  calls=calls) from exc

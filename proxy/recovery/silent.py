"""Silent overflow: the upstream answered normally, but its usage shows the prompt did not fit.

Some servers never return an overflow error: z.ai sometimes accepts a prompt above the window
and reports it in usage, or ends the answer with ``finish_reason:
model_context_window_exceeded``; a server generating into a full context stops at once with
``length``; Ollama cuts the prompt to its ``num_ctx`` and reports only what it kept. These
checks are pure functions of the finish reason, the reported usage, the window and our own estimate.
"""

from __future__ import annotations

from proxy.values import frozen_value

__all__ = [
    "SilentOverflow",
    "check_silent_overflow",
    "length_without_output",
    "overflow_finish",
    "prompt_over_window",
    "truncated_prompt",
]

# Finish reasons of a normal answer across OpenAI-compatible servers and Anthropic-style ones.
_NORMAL_FINISH = frozenset({"stop", "tool_calls", "function_call", "end_turn", "stop_sequence"})
_LENGTH_FINISH = frozenset({"length", "max_tokens"})
# z.ai ends a 200 answer with this finish reason instead of failing the request.
_OVERFLOW_FINISH = frozenset({"model_context_window_exceeded", "context_length_exceeded"})
_FULL_WINDOW_SHARE = 0.99
_TRUNCATION_SHARE = 0.5


@frozen_value
class SilentOverflow:
    kind: str  # overflow_finish | prompt_over_window | length_without_output | truncated
    window: int
    prompt_tokens: int
    estimate: int | None = None


def overflow_finish(finish_reason: str | None) -> bool:
    """A finish reason that itself says the context window was exceeded."""
    return finish_reason in _OVERFLOW_FINISH


def prompt_over_window(finish_reason: str | None, prompt_tokens: int | None, window: int) -> bool:
    """A normal finish whose reported prompt (cached tokens included) exceeds the window."""
    return (
        finish_reason in _NORMAL_FINISH
        and prompt_tokens is not None
        and window > 0
        and prompt_tokens > window
    )


def length_without_output(
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    window: int,
) -> bool:
    """Stopped for length with no output, the prompt filling >= 99% of the window."""
    return (
        finish_reason in _LENGTH_FINISH
        and completion_tokens == 0
        and prompt_tokens is not None
        and window > 0
        and prompt_tokens >= _FULL_WINDOW_SHARE * window
    )


def truncated_prompt(
    prompt_tokens: int | None,
    estimate: int | None,
    window: int,
    share: float = _TRUNCATION_SHARE,
) -> bool:
    """Ollama-style truncation: we sent more than the window and the server counted far less.

    Only when our estimate is above the window: below it a low count is a tokenizer difference
    (or prompt caching accounting), not a cut.
    """
    return (
        prompt_tokens is not None
        and estimate is not None
        and window > 0
        and estimate > window
        and prompt_tokens < share * estimate
    )


def check_silent_overflow(
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    window: int | None,
    estimate: int | None = None,
) -> SilentOverflow | None:
    """The first silent-overflow sign in a finished answer, or None."""
    if overflow_finish(finish_reason):
        return SilentOverflow("overflow_finish", window or 0, prompt_tokens or 0, estimate)
    if window is None or window <= 0 or prompt_tokens is None:
        return None
    if prompt_over_window(finish_reason, prompt_tokens, window):
        return SilentOverflow("prompt_over_window", window, prompt_tokens, estimate)
    if length_without_output(finish_reason, prompt_tokens, completion_tokens, window):
        return SilentOverflow("length_without_output", window, prompt_tokens, estimate)
    if truncated_prompt(prompt_tokens, estimate, window):
        return SilentOverflow("truncated", window, prompt_tokens, estimate)
    return None

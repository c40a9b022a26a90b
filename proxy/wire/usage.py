"""Token usage as the upstreams report it, and the adjustment that turns it into the usage
of the request the client sent. The wire's usage shape: every dialect reads into it. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.values import frozen_value

__all__ = ["Usage", "UsageAdjustment"]


@frozen_value
class Usage:
    """Token usage as an OpenAI-compatible upstream reports it; None where it says nothing
    (a missing ``prompt_tokens`` is not 0 prompt tokens)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    @classmethod
    def from_dict(cls, usage: dict[str, Any]) -> Usage:
        # Positional, with a module-level helper: every answer passes here.
        return cls(_number(usage, "prompt_tokens"), _number(usage, "completion_tokens"),
                   _number(usage, "total_tokens"),
                   _number(usage.get("prompt_tokens_details"), "cached_tokens"),
                   _number(usage.get("completion_tokens_details"), "reasoning_tokens"))

    @property
    def input_tokens(self) -> int | None:
        """Prompt tokens not served from the upstream's cache."""
        if self.prompt_tokens is None:
            return None
        return max(self.prompt_tokens - (self.cached_tokens or 0), 0)


def _number(container: object, key: str) -> int | None:
    """An integer count (never a bool) under ``key``, else None."""
    value = container.get(key) if isinstance(container, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class UsageAdjustment:
    """Turns the upstream's usage into the usage of the request the client sent.

    Agents decide when to compact from reported prompt tokens: tokens tailfloor added must not
    make them compact early, tokens it removed must not hide real growth, and a figure above
    the agent's window makes Pi and OpenClaw discard a good answer as a silent overflow, so
    the result stays below ``window``.
    """

    added: int = 0
    removed: int = 0
    window: int | None = None

    def apply(self, usage: dict[str, Any]) -> dict[str, Any]:
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if not isinstance(prompt, int) or isinstance(prompt, bool):
            return usage
        reported = max(prompt - self.added + self.removed, 0)
        if self.window is not None:
            reported = min(reported, self.window - 1)
        out = dict(usage)
        out["prompt_tokens"] = reported
        if isinstance(completion, int) and not isinstance(completion, bool):
            out["total_tokens"] = reported + completion
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            out["prompt_tokens_details"] = {
                **details, "cached_tokens": min(details["cached_tokens"], reported)}
        return out

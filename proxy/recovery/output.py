"""Lowering a request's output limit so that it fits the window, instead of summarizing.

Many overflows are caused by the output reservation, not the prompt: the request asks for
more completion tokens than the window leaves next to its prompt (OpenAI: "you requested 9000
tokens (5000 in the messages, 4000 in the completion)"). When the prompt alone fits, lowering
``max_tokens`` / ``max_completion_tokens`` to what the window leaves keeps every message and
costs no summarizer call; below the policy's minimum output the request is compacted instead.

Pure: the token counter is handed in; nothing is sent or stored here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from proxy.policy.records import Policy
from proxy.recovery.detect import OverflowVerdict
from proxy.recovery.request import RecoveryRequest, sent_tokens
from proxy.tokens import TokenCounter
from proxy.values import frozen_value
from proxy.wire.members import with_output_limit

__all__ = [
    "ClampTrigger",
    "OutputClamp",
    "lowered_output",
    "minimum_output",
    "output_decides",
    "overflow_clamp",
    "plan_clamp",
    "should_compact",
]

ClampTrigger = Literal["preflight", "overflow"]  # tailfloor_output_lowered_total{trigger}


@frozen_value
class OutputClamp:
    """A request sent with its output limit lowered, its messages unchanged."""

    body: bytes
    trigger: ClampTrigger
    requested: int  # the output limit the request asked for
    limit: int  # what it was lowered to
    window: int
    prompt_tokens: int  # the prompt's size the limit was computed from
    measured: bool  # that size is the upstream's count (from its error), not our estimate
    session: str

    @property
    def label(self) -> str:
        """Its part of x-tailfloor."""
        return f"clamped:{self.trigger}"


def minimum_output(policy: Policy, requested: int) -> int:
    """The least output a lowered request may keep: ``min_output_tokens``, or the
    ``min_output_share`` of what was asked when that is smaller (a small ask stays
    lowerable)."""
    share = math.ceil(requested * policy.min_output_share)
    return max(1, min(policy.min_output_tokens, share))


def lowered_output(requested: int, prompt: int, window: int, minimum: int) -> int | None:
    """The output limit that fits ``window`` next to ``prompt`` tokens; None when the output
    is not what overflows (no limit asked, or the asked one fits) or when what fits is below
    ``minimum`` (the prompt itself must shrink)."""
    if requested <= 0 or window <= 0:
        return None
    room = window - prompt
    if room >= requested or room < minimum:
        return None
    return room


def plan_clamp(body: bytes, *, policy: Policy, requested: int, prompt: int, window: int,
               trigger: ClampTrigger, measured: bool, session: str) -> OutputClamp | None:
    """``body`` with its output lowered to fit, or None (nothing to lower, too little room,
    or a body whose limit cannot be rewritten in place)."""
    # Our estimate may be a little low: leave some of the window for that (the upstream's own
    # count, from its error, needs none).
    slack = 0 if measured else max(16, window // 50)
    limit = lowered_output(requested, prompt + slack, window, minimum_output(policy, requested))
    if limit is None:
        return None
    lowered = with_output_limit(body, limit)
    if lowered is None:
        return None
    return OutputClamp(body=lowered, trigger=trigger, requested=requested, limit=limit,
                       window=window, prompt_tokens=prompt, measured=measured, session=session)


def output_decides(request: RecoveryRequest, prompt: int) -> bool:
    """A request over the budget only by its output limit: with a known window, a prompt
    (our estimate) within the budget and an output that fits, or can be lowered to fit, the
    window, it goes without a summary. The reserve is room for an answer and for counting
    error; a request that names its answer's size needs it only for the counting error."""
    window, requested = request.ctx.known_window, request.requested_output
    if not window or not requested or prompt > request.budget:
        return False
    return prompt + requested <= window or lowered_output(
        requested, prompt, window, minimum_output(request.policy, requested)) is not None


def overflow_clamp(request: RecoveryRequest, tokens: TokenCounter, verdict: OverflowVerdict, *,
                   clamped: OutputClamp | None,
                   sent: tuple[Sequence[Any], bytes] | None = None) -> OutputClamp | None:
    """What overflowed (``sent``: a compaction's messages and body, else the floor's draft)
    with its output lowered to fit: by the error's prompt count, else by our estimate, unless
    our estimate already set the limit that overflowed (``clamped``)."""
    requested, window = request.requested_output, request.ctx.known_window
    if not requested or not window:
        return None
    messages, body = sent if sent is not None else (request.draft.message_list(request.chat),
                                                    request.draft.body)
    if verdict.prompt_tokens is not None:
        prompt, measured = verdict.prompt_tokens, True
    elif clamped is not None:
        return None
    else:
        prompt = sent_tokens(tokens, request.spec, request.chat, messages) - requested
        measured = False
    return plan_clamp(body, policy=request.policy, requested=requested, prompt=prompt,
                      window=window, trigger="overflow", measured=measured,
                      session=request.session)


def should_compact(request: RecoveryRequest, prompt: int, *, marked: str | None
                   ) -> tuple[str | None, bool]:
    """Why the request is compacted before it is sent (None: it is not), and whether only
    its output limit must come down to fit instead. ``prompt``: its estimate with what is
    summarized already applied; ``marked``: why its session's last answer asked for it."""
    if marked is not None:
        return marked, False
    over = request.policy.preflight and prompt + request.requested_output > request.budget
    if not over or request.ctx.signals.cache_warm:
        return None, False
    if output_decides(request, prompt):
        return None, True
    return "preflight", False

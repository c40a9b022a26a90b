"""One chat request's context, built once by the exchange and handed to every stage.

The floor and recovery both read the same facts, so they can never disagree about them: the
request's signals (agent from path, header or Runtime line; session id and key; summary and
tail), the policy the rules give it, the model's spec and window, and which session it
belongs to. Pure apart from the session lookup, which reads the catalog in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.identity.identify import RequestSignals, identify
from proxy.identity.lineage import Lineage, Tenant
from proxy.identity.sessions import SessionFinder
from proxy.model import ChatRequest
from proxy.policy.records import ModelSpec, Policy, RuleSet

__all__ = ["LARGE_BYTES", "LARGE_MESSAGES", "RequestContext", "build_context", "is_large"]

# Requests above either bound are worked on in a worker thread, never on the event loop.
LARGE_BYTES = 256 * 1024
LARGE_MESSAGES = 2000
_NOT_LOOKED_UP = Tenant(False)


@dataclass(frozen=True, slots=True)
class RequestContext:
    chat: ChatRequest
    headers: Mapping[str, str]
    signals: RequestSignals
    policy: Policy
    spec: ModelSpec  # its margin the ratio learned from the upstream, when one was
    window: int  # learned from the upstream, else the rules' model table
    known_window: int | None  # learned, or named by a model table row (not the fallback)
    lineage: Lineage
    tenant: Tenant
    print_: str | None  # the request's fingerprint, when the session was looked up
    large: bool
    error: str | None = None  # identification failed (the request passes through)

    @property
    def messages(self) -> list[Any] | None:
        found = self.chat.body.get("messages")
        return found if isinstance(found, list) else None

    @property
    def session(self) -> str | None:
        return self.lineage.session_id

    def with_window(self, window: int) -> RequestContext:
        return replace(self, window=window, known_window=window)


def is_large(chat: ChatRequest) -> bool:
    messages = chat.body.get("messages")
    return len(chat.raw) > LARGE_BYTES or (isinstance(messages, list)
                                           and len(messages) > LARGE_MESSAGES)


def build_context(chat: ChatRequest, headers: Mapping[str, str], rules: RuleSet, *,
                  windows: LearnedWindows, upstream: str, sessions: SessionFinder | None,
                  signals: RequestSignals | None = None,
                  ratios: TokenRatios | None = None) -> RequestContext:
    """Signals, policy, model and session of one request. ``signals`` (a pass over every
    message) may be computed beforehand, off the event loop, for a large request."""
    if signals is None:
        signals = identify(chat.agent_id, headers, chat.body, rules.identification)
    policy = rules.resolve(signals.agent_id, chat.model,
                           signals.session_key or signals.session_id, chat.route)
    spec = rules.model(chat.model)
    ratio = ratios.ratio(upstream, chat.model) if ratios is not None else None
    learned = windows.window(upstream, chat.model)
    known = learned or (None if spec is rules.unknown_model else spec.context_window)
    lineage, tenant, print_ = Lineage("not_looked_up"), _NOT_LOOKED_UP, None
    error = None
    if signals.is_summarization:
        lineage = Lineage("summarization")
    elif policy.mode != "off" and sessions is not None and isinstance(
            chat.body.get("messages"), list):
        try:
            found = sessions.find(signals, chat.body, rules)
            lineage, tenant, print_ = found.lineage, found.tenant, found.print_
        except Exception as exc:  # an identification bug costs the floor, never the request
            lineage, error = Lineage("error"), f"{type(exc).__name__}: {exc}"[:200]
    # A learned ratio raises the margin, never lowers what the rules set: one request's count
    # must not take away the room the operator kept for counting error.
    measured = spec if ratio is None else replace(spec, margin=max(spec.margin, ratio - 1.0))
    return RequestContext(chat=chat, headers=headers, signals=signals, policy=policy,
                          spec=measured, window=learned or spec.context_window, known_window=known,
                          lineage=lineage, tenant=tenant, print_=print_, large=is_large(chat),
                          error=error)


def runs_ahead(ctx: RequestContext) -> bool:
    """A conversation with history (a summary, an answer) that no transcript holds."""
    signals = ctx.signals
    return (ctx.lineage.method == "unidentified" and ctx.policy.mode != "off"
            and not signals.is_summarization
            and (signals.has_assistant or signals.summary_index is not None))


def first_of_session(ctx: RequestContext) -> bool:
    """A conversation without history that found no predecessor here: the first request of a
    new session, whose predecessor another replica may have seen."""
    signals = ctx.signals
    return (not ctx.lineage.identified and ctx.policy.mode != "off"
            and not signals.is_summarization and not signals.has_assistant
            and signals.summary_index is None)

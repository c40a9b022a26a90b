"""One chat request's context, built once by the exchange and handed to every stage.

The floor and recovery both read the same facts, so they can never disagree about them: the
request's signals (agent from path, header or Runtime line; session id and key; summary and
tail), the policy the rules give it, the model's facts (``proxy.facts.resolve``), and which
session it belongs to. Pure apart from the session lookup, which reads the catalog in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.chat import ChatRequest
from proxy.facts.resolve import ModelFacts, ModelFactsResolver
from proxy.identity.identify import RequestSignals, identify
from proxy.identity.lineage import (
    ERROR,
    NOT_LOOKED_UP,
    SUMMARIZATION,
    UNAUTHENTICATED,
    Lineage,
    Tenant,
)
from proxy.identity.sessions import SessionFinder
from proxy.policy.agent_keys import AgentKeys, KeyVerdict
from proxy.policy.records import ModelSpec, Policy, RuleSet
from proxy.values import frozen_value

__all__ = ["ContextBuilder", "RequestContext", "build_context", "first_of_session",
           "runs_ahead"]

_NOT_LOOKED_UP = Tenant(False)


@frozen_value
class RequestContext:
    chat: ChatRequest
    headers: Mapping[str, str]
    signals: RequestSignals
    policy: Policy
    model: ModelFacts
    # ``model``'s own fields again, read by every stage many times a request (plain fields
    # cost less than properties there)
    spec: ModelSpec
    window: int
    known_window: int | None
    lineage: Lineage
    tenant: Tenant
    print_: str | None  # the request's fingerprint, when the session was looked up
    error: str | None = None  # identification failed (the request passes through)
    # This request recorded its session's first fingerprint: it cannot also be the proof
    # that it agrees with that session.
    planted_print: bool = False
    # Roots of keyed agents ([[agents]] key_file) this request did not prove it is: nothing
    # of their sessions is given to it.
    guarded: frozenset[str] = frozenset()

    @property
    def large(self) -> bool:
        return self.chat.large

    @property
    def messages(self) -> list[Any] | None:
        found = self.chat.body.get("messages")
        return found if isinstance(found, list) else None

    @property
    def session(self) -> str | None:
        return self.lineage.session_id

    def with_model(self, model: ModelFacts) -> RequestContext:
        if model is self.model:
            return self
        return replace(self, model=model, spec=model.spec, window=model.window,
                       known_window=model.known_window)


def build_context(chat: ChatRequest, headers: Mapping[str, str], rules: RuleSet, *,
                  models: ModelFactsResolver, sessions: SessionFinder | None,
                  signals: RequestSignals | None = None, key: KeyVerdict = "open",
                  guarded: frozenset[str] = frozenset()) -> RequestContext:
    """Signals, policy, model and session of one request. ``signals`` (a pass over every
    message) may be computed beforehand, off the event loop, for a large request. ``key``:
    what its agent prefix's key check found; ``guarded``: keyed agents' roots it may not
    draw on."""
    if signals is None:
        signals = identify(chat.agent_id, headers, chat.body, rules.identification)
    policy = rules.resolve(signals.agent_id, chat.model,
                           signals.session_key or signals.session_id, chat.route)
    lineage, tenant, print_ = NOT_LOOKED_UP, _NOT_LOOKED_UP, None
    error, planted = None, False
    if key in ("missing", "wrong"):
        # A keyed agent's prefix without its key: passed through, never looked up.
        lineage = UNAUTHENTICATED
    elif signals.is_summarization:
        lineage = SUMMARIZATION
    elif policy.mode != "off" and sessions is not None and isinstance(
            chat.body.get("messages"), list):
        try:
            found = sessions.find(signals, chat.body, rules)
            lineage, tenant, print_ = found.lineage, found.tenant, found.print_
            planted = found.planted
        except Exception as exc:  # an identification bug costs the floor, never the request
            lineage, error = ERROR, f"{type(exc).__name__}: {exc}"[:200]
    model = models.facts(rules, chat.model)
    return RequestContext(chat=chat, headers=headers, signals=signals, policy=policy,
                          model=model, spec=model.spec, window=model.window,
                          known_window=model.known_window, lineage=lineage,
                          tenant=tenant, print_=print_, error=error, planted_print=planted,
                          guarded=guarded)


class ContextBuilder:
    """``build_context`` with what stays the same for every request of the process."""

    def __init__(self, models: ModelFactsResolver, sessions: SessionFinder | None,
                 keys: AgentKeys | None = None) -> None:
        self.models = models
        self.sessions = sessions
        self.keys = keys if keys is not None else AgentKeys()
        self._keyed: tuple[RuleSet | None, dict[str, str]] = (None, {})

    def build(self, chat: ChatRequest, headers: Mapping[str, str], rules: RuleSet,
              signals: RequestSignals | None = None, *, look_up: bool = True
              ) -> RequestContext:
        """``look_up=False``: the session is not looked for (lineage ``not_looked_up``)."""
        key = self.keys.verdict(chat.agent_id, headers)
        guarded: frozenset[str] = frozenset()
        if rules.agents:
            roots = self._keyed_roots(rules)
            if roots:
                mine = roots.get(chat.agent_id or "") if key == "ok" else None
                guarded = frozenset(r for r in roots.values() if r != mine)
        return build_context(chat, headers, rules, models=self.models,
                             sessions=self.sessions if look_up else None,
                             signals=signals, key=key, guarded=guarded)

    def _keyed_roots(self, rules: RuleSet) -> dict[str, str]:
        """Agent id -> resolved root of every keyed agent (worked out once per rules)."""
        known, roots = self._keyed
        if known is not rules:
            roots = {a.agent_id: (self.sessions.resolved(a.root) if self.sessions else a.root)
                     for a in rules.agents if a.key_file is not None}
            self._keyed = (rules, roots)
        return roots

    def identify(self, chat: ChatRequest, headers: Mapping[str, str], rules: RuleSet
                 ) -> RequestSignals:
        """The signals alone (a pass over every message: a worker thread's job when large),
        and the fingerprint the session lookup will want, made ahead in the same thread."""
        signals = identify(chat.agent_id, headers, chat.body, rules.identification)
        if self.sessions is not None and isinstance(chat.body.get("messages"), list):
            self.sessions.prime(chat.body)
        return signals


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

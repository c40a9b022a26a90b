"""The floor composed as the exchange composes it (context, session finder, stage, recorder),
for tests and benchmarks that drive it in process."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from proxy.chat import ChatRequest
from proxy.context import RequestContext, build_context
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.floor.decision import Decision
from proxy.floor.stage import Floor, TailSource
from proxy.identity.prompt_prints import Fingerprints
from proxy.identity.sessions import SessionFinder
from proxy.metrics import Metrics
from proxy.policy.records import RuleSet
from proxy.server.outgoing import Outgoing
from proxy.server.record import Recorder
from proxy.tokens import TokenCounter


class RulesSource(Protocol):
    @property
    def rules(self) -> RuleSet: ...


class FloorHarness:
    def __init__(self, rules: RulesSource, tokens: TokenCounter, catalog: TailSource | None,
                 metrics: Metrics | None = None, *, prints: Fingerprints | None = None,
                 clock: Callable[[], float] = time.time, single_tenant: bool = True,
                 resolve_root: Callable[[str], str] = lambda root: root) -> None:
        self.rules = rules
        self.prints = prints if prints is not None else Fingerprints()
        self.sessions = SessionFinder(catalog, prints=self.prints, single_tenant=single_tenant,
                                      resolve_root=resolve_root) if catalog is not None else None
        self.floor = Floor(catalog, tokens, self.prints, clock)
        self.windows = LearnedWindows()
        self.recorder = Recorder(metrics) if metrics is not None else None

    def context(self, chat: ChatRequest, headers: Mapping[str, str]) -> RequestContext:
        return build_context(chat, headers, self.rules.rules, sessions=self.sessions,
                             models=ModelFactsResolver(self.windows, TokenRatios(), "test"))

    def decide(self, chat: ChatRequest, headers: Mapping[str, str]) -> Decision:
        return self.floor.decide(self.context(chat, headers))

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Outgoing:
        ctx = self.context(chat, headers)
        decision = self.floor.decide(ctx)
        if self.recorder is not None:
            self.recorder.floor(decision)
        return Outgoing(decision, report_client_usage=ctx.policy.report_usage == "client")

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

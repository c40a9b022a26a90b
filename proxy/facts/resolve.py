"""The facts every stage budgets a model with, worked out in one place.

A model's window is what its upstream told us in an overflow error, else the rules' model
table (a guess for most models); its margin is the table's, raised (never lowered) by the
token ratio learned from the upstream's own counts. The context, the floor and every phase of
recovery read them from here, so two stages can never budget one request with two windows,
and a phase that runs after another request learned a window sees it (``current``).
Pure: memory only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.policy.records import ModelSpec, RuleSet

__all__ = ["ModelFacts", "ModelFactsResolver"]

_KNOWN = 1024  # (rules, model) pairs remembered; model names are the client's: bounded


@dataclass(frozen=True, slots=True)
class ModelFacts:
    spec: ModelSpec  # its margin raised by the learned token ratio, when one was learned
    window: int  # learned from the upstream, else the rules' model table (or its fallback)
    known_window: int | None  # learned, or named by a table row (not the fallback)


class ModelFactsResolver:
    def __init__(self, windows: LearnedWindows, ratios: TokenRatios, upstream: str) -> None:
        self.windows = windows
        self.ratios = ratios
        self.upstream = upstream
        # The facts of each (rules, model) as long as nothing was learned since: every
        # request asks at least twice, and the answer rarely changes.
        self._known: dict[tuple[int, str], tuple[RuleSet, int, int, ModelFacts]] = {}

    def facts(self, rules: RuleSet, model: str) -> ModelFacts:
        key = (id(rules), model)
        known = self._known.get(key)
        windows, ratios = self.windows.changes, self.ratios.changes
        if known is not None and known[0] is rules and known[1] == windows \
                and known[2] == ratios:
            return known[3]
        found = self._resolve(rules, model)
        if len(self._known) >= _KNOWN:
            self._known.clear()
        self._known[key] = (rules, windows, ratios, found)
        return found

    def _resolve(self, rules: RuleSet, model: str) -> ModelFacts:
        spec = rules.model(model)
        ratio = self.ratios.ratio(self.upstream, model)
        learned = self.windows.window(self.upstream, model)
        known = learned or (None if spec is rules.unknown_model else spec.context_window)
        # A learned ratio raises the margin, never lowers what the rules set: one request's
        # count must not take away the room the operator kept for counting error.
        measured = spec if ratio is None else replace(spec, margin=max(spec.margin, ratio - 1.0))
        return ModelFacts(measured, learned or spec.context_window, known)

    def learn_window(self, model: str, window: int | None) -> bool:
        """An upstream's stated window; True when it is new or changed."""
        return self.windows.learn(self.upstream, model, window)

    def learn_ratio(self, model: str, measured: int | None, ours: int) -> float | None:
        return self.ratios.learn(self.upstream, model, measured, ours)

"""What goes upstream for one attempt of a chat request, and everything done to make it.

One record carried to the end of the request: the floor's decision, recovery's compaction (if
any), its lowered output limit (if any), and from them the body, the ``x-tailfloor`` verdict
and the usage adjustment, each derived once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.chat import Draft
from proxy.floor.decision import Decision
from proxy.recovery.outcome import Compaction, ErrorStep, Prepared
from proxy.recovery.output import OutputClamp
from proxy.report import Origin
from proxy.values import frozen_value
from proxy.wire.usage import UsageAdjustment

__all__ = ["Outgoing"]


@frozen_value
class Outgoing:
    decision: Decision
    compaction: Compaction | None = None
    clamp: OutputClamp | None = None  # made from the body above: its body is the one sent
    report_client_usage: bool = True  # rules' report_usage = "client"

    @property
    def draft(self) -> Draft:
        """What the floor made of the request (recovery's starting point)."""
        return Draft(self.decision.body, self.decision.messages, self.decision.origins)

    @property
    def body(self) -> bytes:
        if self.clamp is not None:
            return self.clamp.body
        return self.compaction.body if self.compaction is not None else self.decision.body

    @property
    def messages(self) -> tuple[dict[str, Any], ...] | None:
        """The chat messages of ``body`` when tailfloor built it (None: the client's own)."""
        if self.clamp is not None or self.compaction is not None:
            return self.compaction.messages if self.compaction is not None else \
                self.decision.messages
        return self.decision.messages

    @property
    def origins(self) -> tuple[Origin, ...] | None:
        """Where each of ``messages`` came from (None: all the agent's)."""
        if self.compaction is not None:
            return self.compaction.origins
        return self.decision.origins

    @property
    def verdict(self) -> str:
        # Read for every request (header, log line, report): no list made on the way.
        floor, compaction, clamp = self.decision, self.compaction, self.clamp
        if compaction is None:
            if clamp is None:
                return floor.verdict
            recovery = clamp.label
        else:
            recovery = compaction.label if clamp is None else \
                f"{compaction.label}+{clamp.label}"
        # A pass-through verdict ("none; reason=...") says nothing once recovery changed it.
        return recovery if floor.kind == "none" else f"{floor.verdict}+{recovery}"

    @property
    def adjust(self) -> UsageAdjustment | None:
        """Turns the upstream's usage into that of the request the client sent."""
        if not self.report_client_usage:
            return None
        added = self.decision.added_tokens if self.decision.added_to_request else 0
        if self.compaction is not None:
            return UsageAdjustment(added=added, removed=self.compaction.tokens_removed,
                                   window=self.compaction.window)
        if not added:
            return None
        return UsageAdjustment(added=added, removed=0, window=self.decision.window)

    def prepared(self, prepared: Prepared) -> Outgoing:
        """What goes upstream once recovery prepared the request before sending it."""
        return replace(self, compaction=prepared.compaction, clamp=prepared.clamp)

    def retried(self, step: ErrorStep) -> Outgoing | None:
        """The attempt a retry step asks for: the same messages with a lower output limit, or
        the compaction (with the output limit the client asked for); None: no retry."""
        if step.action != "retry":
            return None
        if step.clamp is not None:
            return replace(self, clamp=step.clamp)
        if step.compaction is not None:
            return replace(self, compaction=step.compaction, clamp=None)
        return None

"""What goes upstream for one attempt of a chat request, and everything done to make it.

One record carried to the end of the request: the floor's decision, recovery's compaction (if
any), and from them the body, the ``x-tailfloor`` verdict and the usage adjustment, each
derived once.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.floor.decision import Decision
from proxy.model import Draft, UsageAdjustment
from proxy.recovery.outcome import Compaction

__all__ = ["Outgoing"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    decision: Decision
    compaction: Compaction | None = None
    report_client_usage: bool = True  # rules' report_usage = "client"

    @property
    def draft(self) -> Draft:
        """What the floor made of the request (recovery's starting point)."""
        return Draft(self.decision.body, self.decision.messages)

    @property
    def body(self) -> bytes:
        return self.compaction.body if self.compaction is not None else self.decision.body

    @property
    def verdict(self) -> str:
        floor = self.decision
        if self.compaction is None:
            return floor.verdict
        # A pass-through verdict ("none; reason=...") says nothing once recovery changed it.
        if floor.kind == "none":
            return self.compaction.label
        return f"{floor.verdict}+{self.compaction.label}"

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

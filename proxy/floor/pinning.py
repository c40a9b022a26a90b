"""Putting a lineage's pins into a floor decision: after the summary (or before a carry's
opening note), one message, within what the budget leaves (see ``proxy.floor.pins``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.floor.decision import Decision, DecisionKind
from proxy.floor.pins import Pin, missing, pin_message
from proxy.policy.records import Policy
from proxy.report import AGENT, Origin

__all__ = ["PINNED", "with_pins"]

PINNED = Origin("pinned")
Message = dict[str, Any]


def with_pins(decision: Decision, chat: ChatRequest, policy: Policy, pins: Sequence[Pin], *,
              room: int, count: Callable[[str], int], head: int) -> Decision:
    """``decision`` with the pins its messages do not hold raw, in one message; unchanged
    when none is missing or none fits in ``room`` tokens. ``head``: the request's leading
    system messages (where a pass-through's pins go when it has no summary)."""
    if decision.kind not in ("floor", "carry", "none"):
        return decision
    messages: list[Message] = list(decision.messages) if decision.messages is not None \
        else list(chat.body.get("messages") or [])
    lacking = missing(pins, messages)
    if not lacking:
        return replace(decision, details={**decision.details, "pins_active": len(pins)})
    budget = min(policy.pinned_token_budget, room)
    message, kept, dropped = pin_message(lacking, policy.notes.pinned, budget, count)
    if message is None:
        return replace(decision, details={**decision.details, "pins_dropped": dropped,
                                          "pins_active": len(pins)})
    origins = list(decision.origins) if decision.origins is not None else \
        [AGENT] * len(messages)
    at = _position(origins, head)
    messages.insert(at, message)
    origins.insert(at, PINNED)
    tokens = count(message["content"])
    kind: DecisionKind = "floor" if decision.kind == "none" else decision.kind
    verdict = f"floor; pinned={kept}" if decision.kind == "none" else \
        f"{decision.verdict}; pinned={kept}"
    return replace(
        decision, kind=kind, verdict=verdict,
        body=orjson.dumps({**chat.body, "messages": messages}), messages=tuple(messages),
        origins=tuple(origins), added=(*decision.added, message),
        added_tokens=decision.added_tokens + tokens,
        details={**decision.details, "pinned": kept, "pins_dropped": dropped,
                 "pins_active": len(pins)})


def _position(origins: Sequence[Origin], head: int) -> int:
    """After the summary; else before a carry's opening note; else after the head."""
    for index, origin in enumerate(origins):
        if origin.provenance == "summary":
            return index + 1
    for index, origin in enumerate(origins):
        if origin.provenance in ("inserted", "carried"):
            return index
    return head

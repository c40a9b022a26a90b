"""Putting a lineage's pins into a floor decision: after the summary (or before a carry's
opening note), one message, within what the budget leaves (see ``proxy.floor.pins``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.chat import ChatRequest
from proxy.context import RequestContext
from proxy.floor.decision import Decision, DecisionKind
from proxy.floor.pin_index import PinIndex
from proxy.floor.pins import Pin, merged, missing, pin_message, pins_in
from proxy.policy.records import Policy
from proxy.report import AGENT, Origin
from proxy.tokens import TokenCounter, with_margin
from proxy.wire.content import head_length, message_text

__all__ = ["PINNED", "LineagePins", "with_pins"]

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


def _pins_news(ctx: RequestContext) -> bool:
    """The request's user messages after its last assistant message (this turn's: each
    turn's first request shows them) pin something, by the same rules as the transcript."""
    messages = ctx.messages or []
    start = len(messages)
    while start > 0 and not (isinstance(messages[start - 1], dict)
                             and messages[start - 1].get("role") == "assistant"):
        start -= 1
    policy = ctx.policy
    # The reply itself only for a ``!pin ^`` (its text may be long).
    first = max(0, start - 1) if policy.pin_assistant else start
    rows = [(str(i), str(m.get("role")), message_text(m))
            for i, m in enumerate(messages[first:], first)
            if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
    if not any(role == "user" for _i, role, _t in rows):
        return False
    return bool(pins_in(rows, policy.pin_patterns, pin_assistant=policy.pin_assistant,
                        max_pinned=policy.max_pinned).pins)


def _position(origins: Sequence[Origin], head: int) -> int:
    """After the summary; else before a carry's opening note; else after the head."""
    for index, origin in enumerate(origins):
        if origin.provenance == "summary":
            return index + 1
    for index, origin in enumerate(origins):
        if origin.provenance in ("inserted", "carried"):
            return index
    return head


class LineagePins:
    """The floor's pin step: which pins a request's lineage holds, what they cost, and the
    decision with them (reads transcripts through the index: off the event loop, but for
    ``may_pin``)."""

    def __init__(self, index: PinIndex, tokens: TokenCounter) -> None:
        self.index = index
        self.tokens = tokens

    def may_pin(self, ctx: RequestContext) -> bool:
        """Whether a request whose floor holds must still read its lineage's pins: they
        may hold one, or the request's newest user messages pin something (the pins read
        before did not know it, and the transcript may not hold it yet)."""
        sid = ctx.lineage.session_id
        if sid is None or ctx.policy.max_pinned <= 0 or ctx.policy.mode != "enforce":
            return False
        if self.index.may_hold(sid):
            return True
        if _pins_news(ctx):
            self.index.expect(sid)
            return True
        return False

    def of(self, ctx: RequestContext, *more: str | None, inherit: bool = True) -> list[Pin]:
        """The pins of the request's lineage (its session and ``more``: a predecessor, a
        carry's source), oldest first; ``inherit`` off: its session's own only."""
        if ctx.policy.max_pinned <= 0 or ctx.policy.mode != "enforce":
            return []
        sessions = dict.fromkeys(s for s in (ctx.lineage.session_id, *more) if s)
        pins = list(merged(*(self.index.lineage(s, ctx.policy, inherit=inherit)
                             for s in sessions)).pins)
        if ctx.lineage.session_id is not None:
            self.index.holds(ctx.lineage.session_id, bool(pins))
        return pins

    def cost(self, ctx: RequestContext, pins: Sequence[Pin]) -> int:
        lacking = missing(pins, ctx.messages or [])
        if not lacking:
            return 0
        message, _kept, _dropped = pin_message(lacking, ctx.policy.notes.pinned,
                                               ctx.policy.pinned_token_budget,
                                               lambda text: self._text_tokens(text, ctx))
        return self._text_tokens(message["content"], ctx) if message is not None else 0

    def pinned(self, ctx: RequestContext, decision: Decision, pins: list[Pin], *,
               agrees: bool) -> Decision:
        """``decision`` with the lineage's pins the request does not hold. A pass-through
        only when the floor holds and the request shows it is the session's (``agrees``:
        its prompt's fingerprint or strong evidence; a claimed id alone gets no pin); a
        restore has found the request's own messages in the transcript, a carry was
        proven before it was made."""
        if decision.kind == "none" and (decision.verdict != "none; reason=floor_holds"
                                        or not agrees):
            return decision
        if decision.source_session not in (None, ctx.lineage.session_id):
            pins = self.of(ctx, ctx.lineage.predecessor, decision.source_session)
        if not pins:
            return decision
        limit, most = ctx.policy.token_budget(ctx.window) - decision.added_tokens, \
            ctx.policy.pinned_token_budget
        # Room for the pins' whole budget by a bound (floor/stage.py): nothing is tokenized.
        own, _exact = self.tokens.request_within(ctx.chat.body, ctx.spec.encoding,
                                                 ctx.spec.margin, lambda b: limit - b >= most)
        room = limit - own
        summary = ctx.signals.summary_index
        return with_pins(decision, ctx.chat, ctx.policy, pins, room=room,
                         count=lambda text: self._text_tokens(text, ctx),
                         head=summary + 1 if summary is not None
                         else head_length(ctx.messages or []))

    def _text_tokens(self, text: str, ctx: RequestContext) -> int:
        spec = ctx.spec
        counted = self.tokens.per_message([{"role": "user", "content": text}], spec.encoding)
        return with_margin(sum(counted), spec.margin)

"""The floor: every request carries a summary plus at least N raw messages.

Reads top to bottom as the stage runs (design.md section 3):

    identify (request signals) -> policy (rules) -> lineage (which tracked session)
    -> restore after a compaction, or carry the predecessor's tail after a reset
    -> budget cap (drop the oldest added units whole) -> Rewrite

A request that already holds the floor, a summarization call, a request that cannot be tied
to a session with certainty, or any failure here, goes upstream byte for byte. Shadow mode
computes and counts the rewrite but sends the original bytes. What was done is returned as
values (``Decision``); ``FloorRewriter.rewrite`` records metrics and logs from them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.carry import CarrySource, frame, plan_carry, reset_kind
from proxy.identify import RequestSignals, identify
from proxy.lineage import Fingerprints, Lineage, SessionIndex, find_session, fingerprint
from proxy.metrics import Metrics
from proxy.model import ChatRequest, Rewrite, UsageAdjustment
from proxy.restore import Block, is_counted, plan_restore
from proxy.rules import Policy, RuleSet
from proxy.tokens import TokenCounter, with_margin
from proxy.transcripts.records import SessionRecord, TailMessage

__all__ = ["Decision", "FloorRewriter", "TailSource"]

log = logging.getLogger("tailfloor.floor")
Message = dict[str, Any]
# Extra transcript messages read beyond what the floor needs, so the anchor is found even
# when the request repeats a few messages the transcript holds once (OpenClaw retries).
_SLACK = 8


class TailSource(SessionIndex, Protocol):
    """The catalog queries the stage needs (``proxy.transcripts.catalog.Catalog``)."""

    def tail(self, session_id: str, k: int, before: str | None = None) -> list[TailMessage]: ...


class RulesSource(Protocol):
    @property
    def rules(self) -> RuleSet: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What the floor decided for one request (the preview shows it as it is)."""

    kind: str  # floor | carry | shadow | none | off
    verdict: str
    body: bytes
    method: str | None = None  # identification outcome (metrics label); None: not tried
    session_id: str | None = None
    source_session: str | None = None
    messages: tuple[Message, ...] | None = None
    added: tuple[Message, ...] = ()
    added_raw: int = 0
    added_tokens: int = 0
    capped: bool = False
    window: int | None = None
    report_client_usage: bool = True
    would: str | None = None  # shadow: the verdict enforce mode would have given
    details: dict[str, Any] = field(default_factory=dict)

    def as_rewrite(self) -> Rewrite:
        adjust = None
        if self.kind in ("floor", "carry") and self.report_client_usage:
            adjust = UsageAdjustment(added=self.added_tokens, removed=0, window=self.window)
        return Rewrite(body=self.body, verdict=self.verdict, adjust=adjust,
                       messages=self.messages, session_key=self.session_id)


@dataclass(frozen=True, slots=True)
class _Request:
    """One request on its way through the stage."""

    chat: ChatRequest
    signals: RequestSignals
    policy: Policy
    lineage: Lineage
    print_: str | None
    messages: list[Any]
    first: int  # index of the first raw message after the system prompt and summary

    @property
    def own(self) -> list[Any]:
        return self.messages[self.first:]


@dataclass(frozen=True, slots=True)
class _Plan:
    kind: str
    noun: str
    block: Block
    build: Callable[[Sequence[Message]], list[Message]]
    extra: int  # tokens of what is added besides the units (notes, markers)
    source: str


class FloorRewriter:
    """The ``Rewriter`` of the application state (``proxy.state.Rewriter``)."""

    def __init__(self, rules: RulesSource, tokens: TokenCounter, catalog: TailSource | None,
                 metrics: Metrics | None = None, prints: Fingerprints | None = None) -> None:
        self.rules = rules
        self.tokens = tokens
        self.catalog = catalog
        self.metrics = metrics
        self.prints = prints if prints is not None else Fingerprints()
        self._prints_by_system: dict[int, str | None] = {}

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Rewrite:
        try:
            decision = self.decide(chat, headers)
        except Exception:  # a floor bug must degrade to pass-through, never to a 500
            log.exception("floor rewrite failed; request passed through unchanged")
            decision = Decision("none", "none; reason=error", chat.raw, method="error")
        self._record(decision)
        return decision.as_rewrite()

    # ------------------------------------------------------------------ decide
    def decide(self, chat: ChatRequest, headers: Mapping[str, str]) -> Decision:
        rules = self.rules.rules
        signals = identify(chat.agent_id, headers, chat.body, rules.identification)
        if signals.is_summarization:
            return _none(chat, "summarization", "summarization")
        policy = rules.resolve(signals.agent_id, chat.model,
                               signals.session_key or signals.session_id)
        if policy.mode == "off":
            return Decision("off", "off", chat.raw)
        messages = chat.body.get("messages")
        if not isinstance(messages, list) or self.catalog is None:
            return _none(chat, "no_transcripts" if self.catalog is None else "no_messages",
                         "unidentified")
        print_ = self._fingerprint(chat.body)
        lineage = find_session(signals, chat.body, self.catalog, self.prints, print_)
        if lineage.session_id is not None and print_ is not None:
            self.prints.record(lineage.session_id, print_)
        if not lineage.identified:
            return _none(chat, lineage.method, lineage.method)
        if signals.raw_after_summary >= policy.min_tail_messages:
            return _none(chat, "floor_holds", lineage.method, lineage.session_id)
        first = signals.first_raw_index if signals.first_raw_index is not None else len(messages)
        ctx = _Request(chat, signals, policy, lineage, print_, messages, first)
        if signals.summary_index is not None:
            if lineage.session_id is None:
                return _none(chat, "unidentified", lineage.method)
            return self._restore(ctx)
        return self._carry(ctx)

    def _restore(self, ctx: _Request) -> Decision:
        chat, signals, lineage, messages = ctx.chat, ctx.signals, ctx.lineage, ctx.messages
        sid = lineage.session_id
        assert sid is not None and self.catalog is not None
        n = ctx.policy.min_tail_messages
        tail = self.catalog.tail(sid, n + signals.raw_after_summary + _SLACK)
        block = plan_restore(tail, ctx.own, n, signals.style.tool_ids_without_underscore)
        if block is None:
            return _none(chat, "no_anchor", lineage.method, sid)
        summary_at = signals.summary_index
        assert summary_at is not None
        annotated = _annotate(messages[summary_at], ctx.policy.notes.summary_followed)

        def build(kept: Sequence[Message]) -> list[Message]:
            return [*messages[:summary_at], annotated, *messages[summary_at + 1:ctx.first],
                    *kept, *ctx.own]

        extra = self._tokens([annotated], chat) - self._tokens([messages[summary_at]], chat)
        return self._finish(ctx, _Plan("floor", "restored", block, build, extra, sid))

    def _carry(self, ctx: _Request) -> Decision:
        assert self.catalog is not None
        chat, lineage, policy = ctx.chat, ctx.lineage, ctx.policy
        source = self._carry_source(ctx)
        if source is None:
            return _none(chat, "no_predecessor", lineage.method, lineage.session_id)
        if not policy.carries(source.reason):
            return _none(chat, f"{source.reason}_not_carried", lineage.method,
                         lineage.session_id)
        n = policy.min_tail_messages
        tail = self.catalog.tail(source.session_id, n + _SLACK, before=source.before)
        style = ctx.signals.style
        block = plan_carry(tail, ctx.own, n, style.tool_ids_without_underscore)

        def build(kept: Sequence[Message]) -> list[Message]:
            framed = frame(kept, source, policy.notes, block.newest_ts, style.user_parts)
            return [*ctx.messages[:ctx.first], *framed, *ctx.own]

        extra = self._tokens(frame([], source, policy.notes, block.newest_ts, style.user_parts),
                             chat)
        decision = self._finish(ctx, _Plan("carry", "carried", block, build, extra,
                                           source.session_id))
        decision.details["reset_kind"] = source.reason
        return decision

    def _carry_source(self, ctx: _Request) -> CarrySource | None:
        assert self.catalog is not None
        lineage = ctx.lineage
        if lineage.session_id is None:
            if lineage.predecessor is None:
                return None
            kind = "new" if lineage.method == "fingerprint" else "idle"
            return CarrySource(lineage.predecessor, kind,
                               summary=_summary_of(self.catalog.get(lineage.predecessor)))
        record = self.catalog.get(lineage.session_id)
        if record is None:
            return None
        if record.resets:
            last = record.resets[-1]
            return CarrySource(record.session_id, reset_kind(None, last.reason or "reset"),
                               before=last.entry_id)
        pred = self.catalog.get(record.predecessor) if record.predecessor else None
        if pred is None:
            return None
        # Content told us the session: its predecessor must also have looked the same.
        if not lineage.explicit and (ctx.print_ is None
                                     or self.prints.get(pred.session_id) != ctx.print_):
            return None
        if pred.agent_id != record.agent_id and pred.source != "pi":
            return None
        return CarrySource(pred.session_id, reset_kind(record.link), summary=_summary_of(pred))

    # ------------------------------------------------------------------ budget
    def _finish(self, ctx: _Request, plan: _Plan) -> Decision:
        chat, policy, lineage = ctx.chat, ctx.policy, ctx.lineage
        kind, noun, block, extra, source = plan.kind, plan.noun, plan.block, plan.extra, \
            plan.source
        sid = lineage.session_id
        if not block.units:
            return _none(chat, "nothing_to_add", lineage.method, sid)
        spec = self.rules.rules.model(chat.model)
        own = self.tokens.request(chat.body, spec.encoding, spec.margin).total
        costs = [self._tokens(unit, chat) for unit in block.units]
        room = policy.budget(spec.context_window) - own - extra
        kept_from = len(costs)
        total = 0
        while kept_from > 0 and total + costs[kept_from - 1] <= room:
            kept_from -= 1
            total += costs[kept_from]
        capped = kept_from > 0
        kept = [m for unit in block.units[kept_from:] for m in unit]
        if not kept:
            return _none(chat, "no_room", lineage.method, sid, capped=True)
        new_messages = plan.build(kept)
        raw = sum(1 for m in kept if is_counted(m))
        verdict = f"{kind}; {noun}={raw}" + ("; capped" if capped else "")
        body = orjson.dumps({**chat.body, "messages": new_messages})
        decision = Decision(
            kind, verdict, body, method=lineage.method, session_id=sid, source_session=source,
            messages=tuple(new_messages), added=tuple(kept), added_raw=raw,
            added_tokens=total + extra, capped=capped, window=spec.context_window,
            report_client_usage=policy.report_usage == "client",
            details={"budget": policy.budget(spec.context_window), "request_tokens": own,
                     "dropped_units": kept_from})
        if policy.mode == "shadow":
            return Decision("shadow", "shadow; " + verdict, chat.raw, method=lineage.method,
                            session_id=sid, source_session=source, added=tuple(kept),
                            added_raw=raw, added_tokens=total + extra, capped=capped,
                            would=verdict, details=decision.details)
        return decision

    def _tokens(self, messages: Sequence[Message], chat: ChatRequest) -> int:
        spec = self.rules.rules.model(chat.model)
        return with_margin(sum(self.tokens.per_message(messages, spec.encoding)), spec.margin)

    def _fingerprint(self, body: Mapping[str, Any]) -> str | None:
        # System prompts are 2-40 KB: normalise each distinct one once.
        messages = body.get("messages")
        head = messages[0] if isinstance(messages, list) and messages else None
        key = hash((orjson.dumps(head), orjson.dumps(body.get("tools") or [])))
        if key in self._prints_by_system:
            return self._prints_by_system[key]
        found = fingerprint(body)
        if len(self._prints_by_system) >= 4096:
            self._prints_by_system.clear()
        self._prints_by_system[key] = found
        return found

    # ----------------------------------------------------------------- metrics
    def _record(self, decision: Decision) -> None:
        metrics = self.metrics
        if decision.kind == "shadow" or (decision.kind in ("floor", "carry")
                                          and log.isEnabledFor(logging.DEBUG)):
            log.info("floor %s (session %s, from %s, %d tokens)", decision.verdict,
                     decision.session_id, decision.source_session, decision.added_tokens,
                     extra={"verdict": decision.verdict, "session": decision.session_id})
        if metrics is None:
            return
        if decision.method is not None:
            metrics.identification.labels(method=decision.method).inc()
        if decision.kind == "off":
            return
        metrics.rewrites.labels(kind=decision.kind).inc()
        if decision.capped:
            metrics.floor_capped.inc()
        if decision.kind in ("floor", "carry"):
            metrics.tail_messages_injected.inc(decision.added_raw)
            metrics.tail_tokens_injected.inc(decision.added_tokens)


def _none(chat: ChatRequest, reason: str, method: str | None, session_id: str | None = None,
          *, capped: bool = False) -> Decision:
    return Decision("none", f"none; reason={reason}", chat.raw, method=method,
                    session_id=session_id, capped=capped)


def _summary_of(record: SessionRecord | None) -> str | None:
    if record is None or record.compaction is None:
        return None
    return record.compaction.summary or None


def _annotate(summary: object, note: str) -> Message:
    """The agent's summary message with the note that the raw tail follows it."""
    message = dict(summary) if isinstance(summary, Mapping) else {"role": "user"}
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = content + "\n\n" + note
    elif isinstance(content, list):
        parts = list(content)
        at = next((i for i, p in enumerate(parts) if isinstance(p, Mapping)
                   and "</summary>" in str(p.get("text", ""))), None)
        if at is None:
            parts.append({"type": "text", "text": note})
        else:
            parts[at] = {**parts[at], "text": str(parts[at]["text"]) + "\n\n" + note}
        message["content"] = parts
    return message

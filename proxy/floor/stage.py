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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.floor.carry import CarrySource, frame, plan_carry, reset_kind
from proxy.floor.decision import Decision, annotate, none, summary_of
from proxy.floor.fingerprints import Fingerprints, fingerprint
from proxy.floor.identify import RequestSignals, identify
from proxy.floor.lineage import ONE_TENANT, Lineage, SessionIndex, Tenant, find_session
from proxy.floor.restore import Block, is_counted, plan_restore, prefix_of, wire_key
from proxy.floor.style import Prefix
from proxy.metrics import Metrics
from proxy.model import ChatRequest, Rewrite
from proxy.policy.records import Policy, RuleSet
from proxy.tokens import TokenCounter, with_margin
from proxy.transcripts.records import TailMessage
from proxy.wire.content import message_text

__all__ = ["Decision", "FloorRewriter", "TailSource"]

log = logging.getLogger("tailfloor.floor")
Message = dict[str, Any]
# Extra transcript messages read beyond what the floor needs, so the anchor is found even
# when the request repeats a few messages the transcript holds once (OpenClaw retries).
_SLACK = 8
_PROBE = 6  # newest transcript messages compared with the request to learn its user prefix


class TailSource(SessionIndex, Protocol):
    """The catalog queries the stage needs (``proxy.transcripts.catalog.Catalog``)."""

    def tail(self, session_id: str, k: int, before: str | None = None) -> list[TailMessage]: ...


class RulesSource(Protocol):
    @property
    def rules(self) -> RuleSet: ...


@dataclass(frozen=True, slots=True)
class _Request:
    """One request on its way through the stage."""

    chat: ChatRequest
    signals: RequestSignals
    policy: Policy
    lineage: Lineage
    tenant: Tenant
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
    """The ``Rewriter`` of the application state (``proxy.server.state.Rewriter``)."""

    def __init__(self, rules: RulesSource, tokens: TokenCounter, catalog: TailSource | None,
                 metrics: Metrics | None = None, *, prints: Fingerprints | None = None,
                 clock: Callable[[], float] = time.time, single_tenant: bool = True,
                 resolve_root: Callable[[str], str] = lambda root: root) -> None:
        self.rules = rules
        # One transcript tenant (one root, or the default roots of one user): content-free
        # identification is trusted for any request. Else only through a bound agent prefix.
        self.single_tenant = single_tenant
        self._resolve_root = resolve_root
        self._bound: dict[str, str] = {}
        self.tokens = tokens
        self.catalog = catalog
        self.metrics = metrics
        self.prints = prints if prints is not None else Fingerprints()
        self.clock = clock
        self._failures: set[str] = set()
        self._prints_by_system: dict[int, str | None] = {}

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Rewrite:
        try:
            decision = self.decide(chat, headers)
        except Exception as exc:  # a floor bug must degrade to pass-through, never to a 500
            where = f"{type(exc).__name__}: {exc}"[:200]
            if where not in self._failures and len(self._failures) < 1000:
                self._failures.add(where)
                log.exception("floor rewrite failed (%s); request passed through unchanged, "
                              "further failures like this one are only counted", where)
            decision = Decision("none", "none; reason=error", chat.raw, method="error")
        self._record(decision)
        return decision.as_rewrite()

    # ------------------------------------------------------------------ decide
    def decide(self, chat: ChatRequest, headers: Mapping[str, str]) -> Decision:
        rules = self.rules.rules
        signals = identify(chat.agent_id, headers, chat.body, rules.identification)
        if signals.is_summarization:
            return none(chat, "summarization", "summarization")
        policy = rules.resolve(signals.agent_id, chat.model,
                               signals.session_key or signals.session_id)
        if policy.mode == "off":
            return Decision("off", "off", chat.raw)
        messages = chat.body.get("messages")
        if not isinstance(messages, list) or self.catalog is None:
            return none(chat, "no_transcripts" if self.catalog is None else "no_messages",
                        "unidentified")
        print_ = self._fingerprint(chat.body)
        tenant = self._tenant(signals, rules)
        lineage = find_session(signals, chat.body, self.catalog, prints=self.prints,
                               print_=print_, tenant=tenant)
        if lineage.session_id is not None and print_ is not None and (
                lineage.evidence == "strong" or (lineage.trusted and tenant.certain
                                                 and self.prints.get(lineage.session_id) is None)):
            # A guessed text or a claimed id never replaces a fingerprint, and plants one only
            # where the tenant is certain: a later fingerprint carry cannot be steered.
            self.prints.record(lineage.session_id, print_)
        if not lineage.identified:
            return none(chat, lineage.method, lineage.method)
        if not lineage.trusted:
            return none(chat, "untrusted", "untrusted", lineage.session_id)
        if signals.raw_after_summary >= policy.min_tail_messages:
            return none(chat, "floor_holds", lineage.method, lineage.session_id)
        first = signals.first_raw_index if signals.first_raw_index is not None else len(messages)
        ctx = _Request(chat, signals, policy, lineage, tenant, print_, messages, first)
        if signals.summary_index is not None:
            if lineage.session_id is None:
                return none(chat, "unidentified", lineage.method)
            return self._restore(ctx)
        return self._carry(ctx)

    def _tenant(self, signals: RequestSignals, rules: RuleSet) -> Tenant:
        """The transcript root the request may draw on without content proof."""
        bound = rules.agent_root(signals.agent_id) if signals.agent_source == "path" else None
        if bound is not None:
            resolved = self._bound.get(bound)
            if resolved is None:
                resolved = self._bound[bound] = self._resolve_root(bound)
            return Tenant(True, resolved)
        return ONE_TENANT if self.single_tenant else Tenant(False)

    def _restore(self, ctx: _Request) -> Decision:
        chat, signals, lineage, messages = ctx.chat, ctx.signals, ctx.lineage, ctx.messages
        sid = lineage.session_id
        assert sid is not None and self.catalog is not None
        n = ctx.policy.min_tail_messages
        summary_at = signals.summary_index
        assert summary_at is not None
        strip = signals.style.tool_ids_without_underscore
        prefix = self._prefix(ctx, sid, sid)
        block = None
        kept_from = self._same_compaction(sid, messages[summary_at])
        if kept_from is not None:
            # The request carries the compaction the catalog knows: the messages it swallowed
            # end right before its first kept entry (no need to read the request's own again).
            tail = self.catalog.tail(sid, n + _SLACK, before=kept_from)
            block = plan_restore(tail, ctx.own, n, strip, anchored=True, prefix=prefix)
        if block is None:
            tail = self.catalog.tail(sid, n + signals.raw_after_summary + _SLACK)
            block = plan_restore(tail, ctx.own, n, strip, prefix=prefix)
        if block is None:
            return none(chat, "no_anchor", lineage.method, sid)
        annotated = annotate(messages[summary_at], ctx.policy.notes.summary_followed)

        def build(kept: Sequence[Message]) -> list[Message]:
            return [*messages[:summary_at], annotated, *messages[summary_at + 1:ctx.first],
                    *kept, *ctx.own]

        extra = self._tokens([annotated], chat) - self._tokens([messages[summary_at]], chat)
        return self._finish(ctx, _Plan("floor", "restored", block, build, extra, sid))

    def _holds_segment(self, ctx: _Request, session_id: str) -> bool:
        """Whether the request carries its session's whole current segment (what follows the
        reset or the session start): a request that only shares a message or two with a
        session (a common "hi") is not that session's, and gets nothing carried into it."""
        assert self.catalog is not None
        mine = [m for m in ctx.own if is_counted(m)]
        segment = [m for r in self.catalog.tail(session_id, len(mine) + 1) for m in r.messages
                   if is_counted(m)]
        if len(segment) > len(mine):
            return False
        # The transcript may lag the request by its newest messages, never the other way.
        return [wire_key(m) for m in segment] == [wire_key(m) for m in mine[:len(segment)]]

    def _prefix(self, ctx: _Request, session_id: str | None, source: str) -> Prefix | None:
        """The agent's user-text prefix, from the request (OpenClaw only prefixes)."""
        assert self.catalog is not None
        probe = self.catalog.tail(session_id, _PROBE) if session_id else []
        rule = prefix_of(ctx.own, probe, self.clock())
        origin = self.catalog.get(source)
        if rule is not None and rule.offset_minutes is None and (
                origin is None or origin.source == "pi"):
            return None  # Pi renders user text verbatim: leave text that looks prefixed alone
        return rule

    def _same_compaction(self, session_id: str, summary: object) -> str | None:
        """The first kept entry of the session's compaction when ``summary`` is its summary."""
        assert self.catalog is not None
        record = self.catalog.get(session_id)
        compaction = record.compaction if record is not None else None
        if compaction is None or not compaction.first_kept_id:
            return None
        text = compaction.summary.strip()
        if not text or text not in message_text(summary):
            return None
        return compaction.first_kept_id

    def _carry(self, ctx: _Request) -> Decision:
        assert self.catalog is not None
        chat, lineage, policy = ctx.chat, ctx.lineage, ctx.policy
        source = self._carry_source(ctx)
        if source is None:
            return none(chat, "no_predecessor", lineage.method, lineage.session_id)
        if not policy.carries(source.reason):
            return none(chat, f"{source.reason}_not_carried", lineage.method,
                        lineage.session_id)
        if lineage.session_id is not None and not self._holds_segment(ctx, lineage.session_id):
            return none(chat, "segment_mismatch", lineage.method, lineage.session_id)
        n = policy.min_tail_messages
        tail = self.catalog.tail(source.session_id, n + _SLACK, before=source.before)
        style = ctx.signals.style
        block = plan_carry(tail, ctx.own, n, style.tool_ids_without_underscore,
                           self._prefix(ctx, lineage.session_id, source.session_id))

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
                               summary=summary_of(self.catalog.get(lineage.predecessor)))
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
        return CarrySource(pred.session_id, reset_kind(record.link), summary=summary_of(pred))

    # ------------------------------------------------------------------ budget
    def _finish(self, ctx: _Request, plan: _Plan) -> Decision:
        chat, policy, lineage = ctx.chat, ctx.policy, ctx.lineage
        kind, noun, block, extra, source = plan.kind, plan.noun, plan.block, plan.extra, \
            plan.source
        sid = lineage.session_id
        if not block.units:
            return none(chat, "nothing_to_add", lineage.method, sid)
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
            return none(chat, "no_room", lineage.method, sid, capped=True)
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
            metrics.identification_by(decision.method).inc()
        metrics.rewrites_by("none" if decision.kind == "off" else decision.kind).inc()
        if decision.capped:
            metrics.floor_capped.inc()
        if decision.kind in ("floor", "carry"):
            metrics.tail_messages_injected.inc(decision.added_raw)
            metrics.tail_tokens_injected.inc(decision.added_tokens)

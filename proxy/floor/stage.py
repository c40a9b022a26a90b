"""The floor: every request carries a summary plus at least N raw messages.

Reads top to bottom as the stage runs (design.md section 3), from the request context the
exchange built (signals, policy, model, session):

    settle: summarization / off / unidentified / untrusted / floor holds -> pass through
    decide: restore after a compaction, or carry the predecessor's tail after a reset
            -> budget cap (drop the oldest added units whole) -> Decision

``settle`` needs nothing but memory and runs on the event loop; ``decide`` reads the
transcripts and counts tokens, so the exchange runs it in a worker thread. A request that
already holds the floor, a summarization call, a request that cannot be tied to a session
with certainty, or any failure here, goes upstream byte for byte. Shadow mode computes the
rewrite but sends the original bytes. The stage returns its ``Decision``; the exchange
records metrics and logs from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from proxy.context import RequestContext
from proxy.floor.carry import CarrySource, frame, plan_carry, reset_kind
from proxy.floor.clean_slate import cleaned, is_clean
from proxy.floor.decision import Decision, DecisionKind, annotate, pass_through, summary_of
from proxy.floor.pin_index import PinIndex, Transcripts
from proxy.floor.pinning import LineagePins
from proxy.floor.restore import USER_SIDE, Block, is_counted, plan_restore, prefix_of, wire_key
from proxy.floor.style import Prefix
from proxy.identity.lineage import SessionIndex
from proxy.identity.prompt_prints import Fingerprints
from proxy.report import AGENT, Origin
from proxy.tokens import TokenCounter, with_margin
from proxy.wire.content import message_text

__all__ = ["Floor", "TailSource"]

Message = dict[str, Any]
# Extra transcript messages read beyond what the floor needs, so the anchor is found even
# when the request repeats a few messages the transcript holds once (OpenClaw retries).
_SLACK = 8
_PROBE = 6  # newest transcript messages compared with the request to learn its user prefix


class TailSource(SessionIndex, Transcripts, Protocol):
    """The catalog queries the stage needs (``proxy.transcripts.catalog.Catalog``)."""


@dataclass(frozen=True, slots=True)
class _Plan:
    kind: DecisionKind
    noun: str
    block: Block
    build: Callable[[Sequence[Message]], list[Message]]
    # Where each message ``build`` returns came from, for ``k`` kept messages.
    origins: Callable[[int], tuple[Origin, ...]]
    extra: int  # tokens of what is added besides the units (notes, markers)
    source: str
    reserve: int = 0  # tokens kept for the pins, which go before the raw tail


class Floor:
    def __init__(self, catalog: TailSource | None, tokens: TokenCounter, prints: Fingerprints,
                 clock: Callable[[], float] = time.time) -> None:
        self.catalog = catalog
        self.tokens = tokens
        self.prints = prints
        self.clock = clock
        self.pinning = LineagePins(PinIndex(catalog), tokens) if catalog is not None \
            else None

    def settle(self, ctx: RequestContext) -> Decision | None:
        """The decision when memory alone gives it (most requests); None: ``rewrite``."""
        early = self._early(ctx)
        if early is not None and early.kind == "none" and self._clean_at(ctx) is not None:
            return None  # the clean-slate marker comes out in ``rewrite``
        return early

    def _early(self, ctx: RequestContext) -> Decision | None:
        chat, lineage, policy = ctx.chat, ctx.lineage, ctx.policy
        if not chat.inspected:
            return pass_through(chat, "too_large", "too_large")
        if chat.pass_reason is not None:  # a dialect request the server holds the state of
            return pass_through(chat, chat.pass_reason, "unidentified")
        if lineage.method == "unauthenticated":
            return pass_through(chat, "unauthenticated", "unauthenticated")
        if ctx.signals.is_summarization:
            return pass_through(chat, "summarization", "summarization")
        if policy.mode == "off":
            return Decision("off", "off", chat.raw)
        if ctx.messages is None or self.catalog is None:
            return pass_through(chat, "no_transcripts" if self.catalog is None else "no_messages",
                        "unidentified")
        if ctx.error is not None:
            return replace(pass_through(chat, "error", "error"), error=ctx.error)
        if not lineage.identified:
            return pass_through(chat, lineage.method, lineage.method)
        if not lineage.trusted:
            return pass_through(chat, "untrusted", "untrusted", lineage.session_id)
        if ctx.guarded and self._guarded(ctx):
            return pass_through(chat, "unauthenticated", "unauthenticated")
        if ctx.signals.raw_after_summary >= policy.min_tail_messages:
            if self.pinning is not None and self.pinning.may_pin(ctx):
                return None  # the floor holds, but a pin may have been summarized away
            return pass_through(chat, "floor_holds", lineage.method, lineage.session_id)
        if ctx.signals.summary_index is not None and lineage.session_id is None:
            return pass_through(chat, "unidentified", lineage.method)
        return None

    def decide(self, ctx: RequestContext) -> Decision:
        """The whole decision: ``settle``, else ``rewrite``."""
        settled = self.settle(ctx)
        return settled if settled is not None else self.rewrite(ctx)

    def rewrite(self, ctx: RequestContext) -> Decision:
        """The decision of a request ``settle`` left open (reads transcripts: off the event
        loop). Never raises: a floor bug degrades to pass-through, never to a 500."""
        try:
            clean = self._clean_at(ctx)
            early = self._early(ctx) if clean is not None else None
            if early is not None:
                return self._cleaned(ctx, early, clean)
            pinning = self.pinning
            # A clean slate inherits nothing of the session before it, its pins neither.
            more = (ctx.lineage.predecessor,) if clean is None else ()
            pins = pinning.of(ctx, *more, inherit=clean is None) if pinning is not None \
                else []
            reserve = pinning.cost(ctx, pins) if pinning is not None else 0
            if ctx.signals.raw_after_summary >= ctx.policy.min_tail_messages:
                decision = pass_through(ctx.chat, "floor_holds", ctx.lineage.method,
                                        ctx.lineage.session_id)
            elif ctx.signals.summary_index is None:
                decision = self._carry(ctx, reserve)
            else:
                decision = self._restore(ctx, reserve)
            if pinning is not None:
                sid = ctx.lineage.session_id
                decision = pinning.pinned(
                    ctx, decision, pins,
                    agrees=sid is not None and decision.kind == "none" and self._agrees(ctx, sid))
            return self._cleaned(ctx, decision, clean)
        except orjson.JSONEncodeError:
            # Nested deeper than a rewrite can serialise (a client's body, not our bug).
            return pass_through(ctx.chat, "too_deep", "too_large")
        except Exception as exc:
            return replace(pass_through(ctx.chat, "error", "error"),
                           error=f"{type(exc).__name__}: {exc}"[:200])

    # -------------------------------------------------------------- the request's parts
    @staticmethod
    def _first(ctx: RequestContext) -> int:
        messages = ctx.messages or []
        first = ctx.signals.first_raw_index
        return first if first is not None else len(messages)

    def _own(self, ctx: RequestContext) -> list[Any]:
        return (ctx.messages or [])[self._first(ctx):]

    # ------------------------------------------------------------------ restore
    def _restore(self, ctx: RequestContext, reserve: int = 0) -> Decision:
        chat, signals, lineage = ctx.chat, ctx.signals, ctx.lineage
        messages = ctx.messages or []
        sid = lineage.session_id
        summary_at = signals.summary_index
        assert sid is not None and summary_at is not None and self.catalog is not None
        n, own, first = ctx.policy.min_tail_messages, self._own(ctx), self._first(ctx)
        strip = signals.style.tool_ids_without_underscore
        prefix = self._prefix(ctx, sid, sid)
        block = None
        kept_from = self._same_compaction(sid, messages[summary_at])
        if kept_from is not None:
            # The request carries the compaction the catalog knows: the messages it swallowed
            # end right before its first kept entry (no need to read the request's own again).
            tail = self.catalog.tail(sid, n + _SLACK, before=kept_from)
            block = plan_restore(tail, own, n, strip, anchored=True, prefix=prefix)
        if block is None:
            tail = self.catalog.tail(sid, n + signals.raw_after_summary + _SLACK)
            block = plan_restore(tail, own, n, strip, prefix=prefix)
        if block is None:
            return pass_through(chat, "no_anchor", lineage.method, sid)
        annotated = annotate(messages[summary_at], ctx.policy.notes.summary_followed)

        def build(kept: Sequence[Message]) -> list[Message]:
            return [*messages[:summary_at], annotated, *messages[summary_at + 1:first],
                    *kept, *own]

        def origins(kept: int) -> tuple[Origin, ...]:
            return (*(AGENT,) * summary_at, Origin("summary", author="agent"),
                    *(AGENT,) * (first - summary_at - 1),
                    *(Origin("restored", session=sid),) * kept, *(AGENT,) * len(own))

        extra = self._tokens([annotated], ctx) - self._tokens([messages[summary_at]], ctx)
        return self._finish(ctx, _Plan("floor", "restored", block, build, origins, extra, sid,
                                       reserve))

    def _holds_segment(self, ctx: RequestContext, session_id: str) -> bool:
        """Whether the request carries its session's whole current segment (what follows the
        reset or the session start): a request that only shares a message or two with a
        session (a common "hi") is not that session's, and gets nothing carried into it."""
        assert self.catalog is not None
        mine = [m for m in self._own(ctx) if is_counted(m)]
        segment = [m for r in self.catalog.tail(session_id, len(mine) + 2) for m in r.messages
                   if is_counted(m)]
        if ctx.signals.cache_warm and len(segment) == len(mine) + 1 \
                and segment[-1].get("role") == "assistant":
            # A cache warm repeats the request the transcript's last answer answered.
            segment = segment[:-1]
        if len(segment) > len(mine):
            return False
        # The transcript may lag the request by its newest messages, never the other way.
        return [wire_key(m) for m in segment] == [wire_key(m) for m in mine[:len(segment)]]

    def _prefix(self, ctx: RequestContext, session_id: str | None, source: str
                ) -> Prefix | None:
        """The agent's user-text prefix, from the request (OpenClaw only prefixes)."""
        assert self.catalog is not None
        # Only what renders as user messages is compared: the rest is not read or rendered.
        probe = self.catalog.tail(session_id, _PROBE, roles=USER_SIDE) if session_id else []
        rule = prefix_of(self._own(ctx), probe, self.clock(), tries=_PROBE)
        origin = self.catalog.get(source)
        if rule is not None and rule.offset_minutes is None and (
                origin is None or origin.source == "pi"):
            return None  # Pi renders user text verbatim: leave text that looks prefixed alone
        return rule

    def _same_compaction(self, session_id: str, summary: object) -> str | None:
        """The first kept entry of the session's compaction when ``summary`` is its summary."""
        assert self.catalog is not None
        record = self.catalog.full(session_id)
        compaction = record.compaction if record is not None else None
        if compaction is None or not compaction.first_kept_id:
            return None
        text = compaction.summary.strip()
        if not text or text not in message_text(summary):
            return None
        return compaction.first_kept_id

    # -------------------------------------------------------------------- carry
    def _carry(self, ctx: RequestContext, reserve: int = 0) -> Decision:
        assert self.catalog is not None
        chat, lineage, policy = ctx.chat, ctx.lineage, ctx.policy
        if self._clean_at(ctx) is not None:
            return pass_through(chat, "clean_slate", lineage.method, lineage.session_id)
        source = self._carry_source(ctx)
        if source is None:
            return pass_through(chat, "no_predecessor", lineage.method, lineage.session_id)
        if not policy.carries(source.reason):
            return pass_through(chat, f"{source.reason}_not_carried", lineage.method,
                        lineage.session_id)
        if lineage.session_id is not None and not self._holds_segment(ctx, lineage.session_id):
            return pass_through(chat, "segment_mismatch", lineage.method, lineage.session_id)
        if not self._agrees(ctx, source.session_id):
            # A claimed id (or session key) names the lineage; only the request itself can
            # show it is that lineage's: its system prompt and tools as the session's own
            # requests had them, or something only the session knows.
            return pass_through(chat, "unproven", lineage.method, lineage.session_id)
        n, own, first = policy.min_tail_messages, self._own(ctx), self._first(ctx)
        messages = ctx.messages or []
        tail = self.catalog.tail(source.session_id, n + _SLACK, before=source.before)
        style = ctx.signals.style
        block = plan_carry(tail, own, n, style.tool_ids_without_underscore,
                           self._prefix(ctx, lineage.session_id, source.session_id))

        def build(kept: Sequence[Message]) -> list[Message]:
            framed = frame(kept, source, policy.notes, block.newest_ts, style.user_parts)
            return [*messages[:first], *framed, *own]

        extra = self._tokens(frame([], source, policy.notes, block.newest_ts, style.user_parts),
                             ctx)
        def origins(kept: int) -> tuple[Origin, ...]:
            note = Origin("inserted")
            return (*(AGENT,) * first, note,
                    *(Origin("carried", session=source.session_id),) * kept, note,
                    *(AGENT,) * len(own))

        decision = self._finish(ctx, _Plan("carry", "carried", block, build, origins, extra,
                                           source.session_id, reserve))
        decision.details["reset_kind"] = source.reason
        return decision

    def _carry_source(self, ctx: RequestContext) -> CarrySource | None:
        assert self.catalog is not None
        lineage = ctx.lineage
        if lineage.session_id is None:
            if lineage.predecessor is None:
                return None
            kind = "new" if lineage.method == "fingerprint" else "idle"
            return CarrySource(lineage.predecessor, kind,
                               summary=summary_of(self.catalog.full(lineage.predecessor)))
        record = self.catalog.full(lineage.session_id)
        if record is None:
            return None
        if record.resets:
            last = record.resets[-1]
            return CarrySource(record.session_id, reset_kind(None, last.reason or "reset"),
                               before=last.entry_id)
        pred = self.catalog.full(record.predecessor) if record.predecessor else None
        if pred is None:
            return None
        if pred.agent_id != record.agent_id and pred.source != "pi":
            return None
        return CarrySource(pred.session_id, reset_kind(record.link), summary=summary_of(pred))

    def _guarded(self, ctx: RequestContext) -> bool:
        """The request's session (or predecessor) lies under a keyed agent's root whose key
        it did not carry."""
        assert self.catalog is not None
        for sid in (ctx.lineage.session_id, ctx.lineage.predecessor):
            record = self.catalog.get(sid) if sid is not None else None
            if record is not None and record.info.root in ctx.guarded:
                return True
        return False

    def _agrees(self, ctx: RequestContext, source: str) -> bool:
        """Whether the request shows it belongs to the lineage it would be given messages of:
        strong evidence (a tool-call id, the agent's summary), or the fingerprint of its system
        prompt and tools (dates, ids and OpenClaw's Runtime fields normalised, so a daily
        reset still agrees) equal to the one the source session's own requests had."""
        if ctx.lineage.evidence == "strong":
            return True
        if ctx.planted_print and source == ctx.lineage.session_id:
            return False
        return ctx.print_ is not None and self.prints.get(source) == ctx.print_

    # ------------------------------------------------------------------- budget
    def _finish(self, ctx: RequestContext, plan: _Plan) -> Decision:
        chat, policy, lineage, spec = ctx.chat, ctx.policy, ctx.lineage, ctx.spec
        block, extra, source = plan.block, plan.extra, plan.source
        sid = lineage.session_id
        if not block.units:
            return pass_through(chat, "nothing_to_add", lineage.method, sid)
        costs = [self._tokens(unit, ctx) for unit in block.units]
        budget, wanted = policy.token_budget(ctx.window) - extra - plan.reserve, sum(costs)
        # The request's new messages (an answer, a tool's output) are not tokenized when
        # a bound shows everything fits; they are counted only when it decides something.
        own, exact = self.tokens.request_within(chat.body, spec.encoding, spec.margin,
                                                lambda bound: wanted <= budget - bound)
        room = budget - own
        kept_from = len(costs)
        total = 0
        while kept_from > 0 and total + costs[kept_from - 1] <= room:
            kept_from -= 1
            total += costs[kept_from]
        capped = kept_from > 0
        kept = [m for unit in block.units[kept_from:] for m in unit]
        if not kept:
            return pass_through(chat, "no_room", lineage.method, sid, capped=True)
        new_messages = plan.build(kept)
        raw = sum(1 for m in kept if is_counted(m))
        verdict = f"{plan.kind}; {plan.noun}={raw}" + ("; capped" if capped else "")
        details = {"budget": policy.token_budget(ctx.window), "dropped_units": kept_from,
                   "request_tokens" if exact else "request_tokens_at_most": own}
        if policy.mode == "shadow":
            return Decision("shadow", "shadow; " + verdict, chat.raw, method=lineage.method,
                            session_id=sid, source_session=source, added=tuple(kept),
                            added_raw=raw, added_tokens=total + extra, capped=capped,
                            would=verdict, details=details)
        origins = plan.origins(len(kept))
        assert len(origins) == len(new_messages)
        return Decision(
            plan.kind, verdict, orjson.dumps({**chat.body, "messages": new_messages}),
            method=lineage.method, session_id=sid, source_session=source,
            messages=tuple(new_messages), origins=origins, added=tuple(kept), added_raw=raw,
            added_tokens=total + extra, capped=capped, window=ctx.window, details=details)

    # -------------------------------------------------------------- clean slate
    @staticmethod
    def _clean_at(ctx: RequestContext) -> int | None:
        """Where the request's first user message asks for a clean slate (enforce mode)."""
        if ctx.policy.mode != "enforce":
            return None
        return is_clean(ctx.messages, ctx.policy.clean_slate_marker)

    @staticmethod
    def _cleaned(ctx: RequestContext, decision: Decision, at: int | None) -> Decision:
        marker = ctx.policy.clean_slate_marker
        if at is None or marker is None or decision.kind == "shadow":
            return decision
        return cleaned(decision, ctx.chat, at, marker)

    def _tokens(self, messages: Sequence[Message], ctx: RequestContext) -> int:
        spec = ctx.spec
        return with_margin(sum(self.tokens.per_message(messages, spec.encoding)), spec.margin)

"""Context overflow recovery around the upstream call.

before_send: a stored compaction whose prefix the request repeats replaces that prefix (no
    summarizer call); a request still estimated above the window minus the reserve (rules
    ``preflight``), or of a session whose last answer was a silent overflow, is compacted now.
    When the window is known and the request names its output limit, only its prompt must
    fit the budget: an output that runs past the window is lowered to fit (``output.py``).
on_error: an overflow error (any provider's wording, rules' extra patterns) teaches the
    model's window; when the prompt alone fits (by the error's numbers, else our estimate),
    the same request goes once more with its output lowered; otherwise the ORIGINAL request
    (the floor's draft, never a previous compaction) is compacted and sent once more; a
    second overflow answers the client with OpenAI's 400 context_length_exceeded so the
    agent's own recovery takes over.
after_answer: silent overflow and overflow errors inside a stream; the session's next
    request is compacted before it is sent.

A compaction keeps the system prompt, puts one summary (made by the upstream model with the
client's own credentials, updating the summary the request already held) in place of
everything before the raw tail, and keeps the tail: at least ``min_tail_messages`` raw
messages and the whole current turn, fewer (oldest tool exchange first) when they do not fit.
When the summarizer fails, the oldest messages are dropped instead, with a note saying so.
Summaries are stored per session (SQLite, proxy/recovery/sqlite_store.py) and reused while the agent
keeps sending the same history.

Every phase returns a value (``outcome.py``); the exchange records metrics and logs. Counting,
planning and the store run through ``offload`` (worker threads), the summarizer call on the
event loop.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from proxy.answer import AnswerSeen, ErrorReply, UpstreamAnswer
from proxy.chat import Draft
from proxy.context import RequestContext
from proxy.facts.learned import BoundedMap
from proxy.facts.resolve import ModelFactsResolver
from proxy.policy.records import Policy, RuleSet
from proxy.recovery.compacted import dropped, summarized
from proxy.recovery.compaction_store import Compactions, LocalCompactions, Offload
from proxy.recovery.credential import CredentialScopes
from proxy.recovery.detect import OverflowDetector, OverflowVerdict, context_length_exceeded_body
from proxy.recovery.locks import SessionLocks
from proxy.recovery.message_chain import KeptFingerprints
from proxy.recovery.outcome import AfterCheck, Compaction, ErrorStep, Prepared, Trigger
from proxy.recovery.output import OutputClamp, overflow_clamp, plan_clamp, should_compact
from proxy.recovery.plan import Cut, Prior, find_cut_point
from proxy.recovery.request import RecoveryRequest
from proxy.recovery.silent import check_silent_overflow
from proxy.recovery.sqlite_store import CompactionStore, StoredCompaction
from proxy.recovery.summarize.service import Summaries
from proxy.recovery.summarize.summarizer import SummarizerTransport
from proxy.telemetry.tracecontext import TraceContext
from proxy.tokens import TokenCounter, requested_output, with_margin

__all__ = ["Offload", "Recovery", "SummaryLock"]


class RulesSource(Protocol):
    @property
    def rules(self) -> RuleSet: ...


class SummaryLock(Protocol):
    """One summary per session across processes (a shared store's lock); ``hold`` yields
    whether another process held it first. Held inside this process's own session lock."""

    def hold(self, session: str, wait: float) -> contextlib.AbstractAsyncContextManager[bool]:
        ...


class Recovery:
    def __init__(self, *, rules: RulesSource, tokens: TokenCounter, models: ModelFactsResolver,
                 transport: SummarizerTransport, offload: Offload) -> None:
        self._rules = rules
        self._tokens = tokens
        self._models = models
        self._offload = offload
        self._summaries = Summaries(transport, tokens, offload)
        self._marked: BoundedMap[str, str] = BoundedMap(4096)  # session -> why
        self._detectors: BoundedMap[tuple[str, ...], OverflowDetector] = BoundedMap(64)
        self._locks = SessionLocks()
        self._store: Compactions | None = None
        self._shared_lock: SummaryLock | None = None
        self._kept = KeptFingerprints()  # the system prompts of derived session keys
        # Credential hashes of store keys are made with the first; the others (a shared
        # store's key being rotated out) still find what was stored with them.
        self.scopes = CredentialScopes()  # keys set at start (server/app.py)

    # -- life cycle (blocking: the application runs these in a worker thread) -----------

    def open(self, directory: Path, store: type[CompactionStore] = CompactionStore) -> None:
        """The embedded store under ``directory``."""
        limits = self._rules.rules.store
        local = store(directory, max_per_session=limits.max_entries_per_session,
                      max_total=limits.max_entries_total)
        self._store = LocalCompactions(local, self._offload,
                                       max_sessions=limits.max_entries_total)

    @property
    def store(self) -> Compactions | None:
        return self._store

    def use(self, store: Compactions, lock: SummaryLock | None = None) -> None:
        """Another store (a shared one), and its lock across processes."""
        self._store, self._shared_lock = store, lock

    async def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            await store.close()

    # -- the three phases ----------------------------------------------------------------

    def view(self, ctx: RequestContext, draft: Draft, trace: TraceContext | None = None
             ) -> RecoveryRequest | None:
        """The request as recovery sees it (once per request); None: left alone (no store,
        an agent's own summarization call, no usable messages)."""
        if self._store is None or ctx.signals.is_summarization:
            return None
        return RecoveryRequest.of(ctx, draft, self._kept, self.scopes, trace)

    async def before_send(self, request: RecoveryRequest | None) -> Prepared | None:
        if request is None or request.policy.mode != "enforce" or self._surely_fits(request):
            return None
        found = await self._find(request)
        prior, prompt = await self._offload(self._preflight, request, found)
        # A cache warm never starts a summary: it repeats a request that fitted, or reuses
        # what that request was given.
        warm = request.ctx.signals.cache_warm
        marked = None if warm else self._marked.pop(request.key)
        why, by_output = should_compact(request, prompt, marked=marked)
        if why is not None:
            compacted = await self._compact(request, prior, trigger="preflight", why=why)
            if compacted is not None:
                return Prepared(compacted)
        reused = None if found is None else await self._reuse(request, found, "reused")
        clamp = None
        if by_output and request.ctx.known_window:
            clamp = await self._offload(
                plan_clamp, reused.body if reused else request.draft.body,
                policy=request.policy, requested=request.requested_output, prompt=prompt,
                window=request.ctx.known_window, trigger="preflight", measured=False,
                session=request.session)
        return Prepared(reused, clamp) if reused or clamp else None

    async def on_error(self, request: RecoveryRequest | None, failed: Compaction | None,
                       answer: UpstreamAnswer, *, attempt: int,
                       clamped: OutputClamp | None = None) -> ErrorStep:
        """``failed``: the compaction that was sent, if recovery made what overflowed;
        ``clamped``: the output limit preflight lowered, if it did."""
        if request is None:
            return ErrorStep.passed()
        verdict = self._detector(request.policy).classify_response(
            answer.status, answer.content_type, answer.body)
        retried = attempt > 0
        if not verdict.is_overflow:
            if retried:
                return ErrorStep.passed(overflow="failed", note=(
                    f"the retry after an overflow failed with HTTP {answer.status} (not an "
                    "overflow); passed on"))
            return ErrorStep.passed()
        learned = None
        if verdict.window and self._models.learn_window(request.chat.model, verdict.window):
            learned = verdict.window
        request = self._current(request)
        step = await self._overflow_step(request, failed, clamped, verdict, retried=retried,
                                         learned=learned)
        if verdict.prompt_tokens is None:
            return step
        ratio = await self._offload(self._learn_ratio, request, failed, verdict.prompt_tokens)
        return replace(step, learned_ratio=ratio) if ratio is not None else step

    async def _overflow_step(self, request: RecoveryRequest, failed: Compaction | None,
                             clamped: OutputClamp | None, verdict: OverflowVerdict, *,
                             retried: bool, learned: int | None) -> ErrorStep:
        policy = request.policy
        if policy.on_overflow == "passthrough" or policy.mode != "enforce" \
                or request.ctx.signals.cache_warm:
            return ErrorStep.passed(overflow="passthrough", verdict=verdict,
                                    learned_window=learned)
        if not retried:
            clamp = await self._offload(self._overflow_clamp, request, failed, clamped, verdict)
            if clamp is not None:
                return ErrorStep("retry", clamp=clamp, verdict=verdict, learned_window=learned)
            found = await self._find(request)
            prior, scale, fits = await self._offload(
                self._after_overflow, request, found, failed, verdict.prompt_tokens)
            if found is not None and failed is None and fits:
                # A summary stored meanwhile (by a concurrent request, or by another replica
                # before this one heard of it) is enough: reuse it, no new summary.
                return ErrorStep("retry", verdict=verdict, learned_window=learned,
                                 compaction=await self._reuse(request, found, "reused:overflow"))
            compacted = await self._compact(request, prior, trigger="overflow",
                                            why=verdict.pattern or "overflow", scale=scale)
            if compacted is None and found is not None and failed is None:
                # sent before a concurrent request of the session stored this compaction
                compacted = await self._reuse(request, found, "reused:overflow")
            if compacted is not None:
                return ErrorStep("retry", compaction=compacted, verdict=verdict,
                                 learned_window=learned)
        reply = ErrorReply(400, context_length_exceeded_body(request.window,
                                                             verdict.prompt_tokens))
        return ErrorStep("reply", reply=reply, overflow="failed", verdict=verdict,
                         learned_window=learned,
                         note="the compacted retry overflowed too" if retried
                         else "nothing to compact")

    def after_answer(self, request: RecoveryRequest | None, sent: Compaction | None,
                     seen: AnswerSeen, clamp: OutputClamp | None = None) -> AfterCheck:
        """A complete answer (or what a client that left had been sent). Counts tokens for
        a large request: the exchange runs it off the loop then."""
        if request is None:
            return AfterCheck()
        request = self._current(request)  # a window learned meanwhile, here or elsewhere
        if seen.stream_error is not None and self._detector(
                request.policy).classify_stream_event({"error": seen.stream_error}).is_overflow:
            self._marked.put(request.key, "mid_stream")
            return AfterCheck(overflow="mid_stream")
        answered = seen.status < 400
        recovered = answered and sent is not None and sent.retry
        clamped = answered and clamp is not None and clamp.trigger == "overflow"
        usage = seen.usage
        window = request.ctx.known_window
        prompt = usage.prompt_tokens if usage is not None else None
        estimate = ratio = ours = None
        body = sent.body if sent is not None else request.draft.body
        if window and prompt is not None and len(body) > window:
            # only then may it show a truncation (a token is at least a byte), and only then
            # is the prompt large enough to tell the upstream's token ratio
            ours = request.sent_prompt(self._tokens, sent.messages if sent else None)
            # what was asked of the upstream: a clamped request asked for less
            output = clamp.limit if clamp is not None else request.requested_output
            estimate = with_margin(ours, request.spec.margin) + output
        silent = check_silent_overflow(
            seen.finish_reason, prompt, usage.completion_tokens if usage else None, window,
            estimate)
        if silent is None and ours is not None and prompt is not None and answered \
                and prompt <= (window or 0) and self._ratio_worthy(request, body):
            ratio = self._models.learn_ratio(request.chat.model, prompt, ours)
        if silent is not None:
            self._marked.put(request.key, silent.kind)
            return AfterCheck(overflow="silent", silent=silent, recovered=recovered,
                              clamped=clamped, learned_ratio=ratio)
        return AfterCheck(recovered=recovered, clamped=clamped, learned_ratio=ratio)

    # -- planning (blocking: runs in a worker thread) ------------------------------------

    def _surely_fits(self, request: RecoveryRequest) -> bool:
        """Nothing stored or marked for the session and the body smaller in bytes than the
        budget in tokens: a text token covers at least one byte, so the request cannot need
        compacting, and a small request costs a few microseconds. Images and audio cost
        tokens their bytes do not show, so those requests take the full path."""
        if request.key in self._marked or (
                self._store is not None and self._store.may_hold(request.key)):
            return False
        body = request.draft.body
        if b'"image_url"' in body or b'"input_audio"' in body:
            return False
        return len(body) + requested_output(request.chat.body) < request.budget

    def _preflight(self, request: RecoveryRequest, found: StoredCompaction | None
                   ) -> tuple[Prior, int]:
        """What is summarized already, and the prompt's estimate once that is applied."""
        prior = _prior(request, found)
        return prior, request.prompt_estimate(self._tokens, prior)

    def _after_overflow(self, request: RecoveryRequest, found: StoredCompaction | None,
                        failed: Compaction | None, upstream_prompt: int | None
                        ) -> tuple[Prior, float, bool]:
        """What is summarized already, the upstream's undercount, and whether the request
        fits its budget with only that applied."""
        scale = request.undercount(self._tokens, failed.messages if failed else None,
                                   upstream_prompt)
        prior = _prior(request, found)
        # by the upstream's count as far as this error tells it (scale <= 1)
        fits = found is not None and (request.prompt_estimate(self._tokens, prior) / scale
                                      + request.requested_output) <= request.budget
        return prior, scale, fits

    async def _find(self, request: RecoveryRequest, *, ask: bool = False
                    ) -> StoredCompaction | None:
        """A stored compaction of the longest prefix of the request, if any. ``ask``: even
        when the store is not known to hold the session (another holder just stored it). A
        shared store is always asked: another replica may have stored one a moment ago."""
        if self._store is None:
            return None
        for key in (request.key, *request.older_keys):
            if ask or self._store.shared or self._store.may_hold(key):
                found = await self._store.find_for(request.conversation, key)
                if found is not None:
                    return found
        return None

    def _ratio_worthy(self, request: RecoveryRequest, body: bytes) -> bool:
        """A request whose count tells the upstream's tokenizer apart from ours: counted by
        the real table, and text only (images and audio are guessed, not counted)."""
        return (self._tokens.encodings.settled(request.spec.encoding)
                and b'"image_url"' not in body and b'"input_audio"' not in body)

    def _learn_ratio(self, request: RecoveryRequest, failed: Compaction | None,
                     measured: int) -> float | None:
        if not self._ratio_worthy(request, failed.body if failed else request.draft.body):
            return None
        ours = request.sent_prompt(self._tokens, failed.messages if failed else None)
        return self._models.learn_ratio(request.chat.model, measured, ours)

    def _overflow_clamp(self, request: RecoveryRequest, failed: Compaction | None,
                        clamped: OutputClamp | None, verdict: OverflowVerdict
                        ) -> OutputClamp | None:
        if failed is None:
            return overflow_clamp(request, self._tokens, verdict, clamped=clamped)
        return overflow_clamp(request, self._tokens, verdict, clamped=clamped,
                              sent=(failed.messages, failed.body))

    def _cut(self, request: RecoveryRequest, prior: Prior, scale: float
             ) -> tuple[Cut, list[int]]:
        costs = request.costs(self._tokens)
        cut = find_cut_point(request.conversation, costs, covered=prior.covered,
                       min_tail=request.policy.min_tail_messages,
                       available=request.available(self._tokens, scale))
        return cut, costs

    async def _reuse(self, request: RecoveryRequest, found: StoredCompaction, label: str
                     ) -> Compaction:
        if self._store is not None:
            await self._store.touch(found)
        return await self._offload(summarized, request, self._tokens, found.summary,
                                   found.message_count, "reused", label=label, why="stored")

    # -- compaction ------------------------------------------------------------------------

    async def _compact(self, request: RecoveryRequest, prior: Prior, *, trigger: Trigger,
                       why: str, scale: float = 1.0) -> Compaction | None:
        """Summary of everything before the tail + the tail; None when nothing can go."""
        cut, costs = await self._offload(self._cut, request, prior, scale)
        if cut.keep <= prior.covered:
            return None
        async with self._locks.hold(request.key) as contended, \
                self._held_across(request) as elsewhere:
            # A concurrent request of the session (here or in another process sharing the
            # store) may have summarized this prefix meanwhile: while this one waited for
            # the lock, or before it took a free one (it planned its cut first).
            found = await self._find(request, ask=contended or elsewhere)
            if found is not None and found.message_count >= cut.keep:
                return await self._reuse(request, found, f"reused:{trigger}")
            material = request.material(prior.covered, cut.keep)
            name = request.policy.summary_model or request.chat.model
            model = request.ctx.model if name == request.chat.model else \
                self._models.facts(self._rules.rules, name)
            summary, attempt = await self._summaries.make(
                request, material, previous=prior.summary, model=model.spec,
                headers=request.ctx.headers, window=model.window)
            if summary is None:
                return await self._offload(dropped, request, self._tokens, prior, cut, costs,
                                           trigger=trigger, why=why, attempt=attempt)
            stored = "no store" if self._store is None else await self._store.put(
                request.key, request.conversation[:cut.keep], summary,
                sum(costs[:cut.keep]))
        label = "reused" if trigger == "reused" else f"compacted:{trigger}"
        return await self._offload(summarized, request, self._tokens, summary, cut.keep,
                                   trigger, label=label, why=why, attempt=attempt,
                                   store_error=stored)

    def _held_across(self, request: RecoveryRequest
                     ) -> contextlib.AbstractAsyncContextManager[bool]:
        if self._shared_lock is None:
            return contextlib.nullcontext(False)
        # Another replica's summary takes at most its summarizer timeout: wait that long.
        return self._shared_lock.hold(request.key,
                                      wait=request.policy.summarizer_timeout + 1.0)

    def _current(self, request: RecoveryRequest) -> RecoveryRequest:
        """The request with its model's facts as they are now: a window or ratio learned
        since its context was built (by this request or a concurrent one) applies."""
        ctx = request.ctx.with_model(self._models.facts(self._rules.rules, request.chat.model))
        return request if ctx is request.ctx else replace(request, ctx=ctx)

    def _detector(self, policy: Policy) -> OverflowDetector:
        """The detector for the rules' extra patterns, compiled once per set of patterns."""
        key = tuple(p.pattern for p in policy.overflow_patterns)
        detector = self._detectors.get(key)
        if detector is None:
            detector = OverflowDetector(key)
            self._detectors.put(key, detector)
        return detector


def _prior(request: RecoveryRequest, found: StoredCompaction | None) -> Prior:
    """What is summarized already: a stored compaction of this prefix, else the agent's."""
    if found is not None:
        return Prior(found.message_count, found.summary)
    return Prior.of(request.conversation)

"""Context overflow recovery around the upstream call (the ``Recovery`` of proxy/state.py).

before_send: a stored compaction whose prefix the request repeats replaces that prefix (no
    summarizer call); a request still estimated above the window minus the reserve (rules
    ``preflight``), or of a session whose last answer was a silent overflow, is compacted now.
on_error: an overflow error (any provider's wording, rules' extra patterns) teaches the
    model's window, then the ORIGINAL request (the floor's output, never a previous
    compaction) is compacted and sent once more; a second overflow answers the client with
    OpenAI's 400 context_length_exceeded so the agent's own recovery takes over.
after_answer: silent overflow and overflow errors inside a stream are counted and logged; the
    session's next request is compacted before it is sent.

A compaction keeps the system prompt, puts one summary (made by the upstream model with the
client's own credentials, updating the summary the request already held) in place of
everything before the raw tail, and keeps the tail: at least ``min_tail_messages`` raw
messages and the whole current turn, fewer (oldest tool exchange first) when they do not fit.
When the summarizer fails, the oldest messages are dropped instead, with a note saying so.
Summaries are stored per session (SQLite, proxy/compaction/store.py) and reused while the
agent keeps sending the same history; when the raw part grows past the budget again the
stored summary is updated with the new messages (previous summary + new messages).

The client is told the usage of the request it sent, never more than the window minus one.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import tempfile
from collections.abc import Mapping
from pathlib import Path

import orjson

from proxy.floor.identify import is_summarization
from proxy.model import ChatRequest, ErrorReply, Outcome, Rewrite, UpstreamAnswer, UsageAdjustment
from proxy.policy.records import Policy
from proxy.recovery.detect import OverflowDetector, context_length_exceeded_body
from proxy.recovery.plan import (
    Message,
    Prior,
    compacted_messages,
    fallback_messages,
    plan_cut,
    runtime_line,
)
from proxy.recovery.request import RecoveryRequest, sent_tokens
from proxy.recovery.silent import check_silent_overflow
from proxy.recovery.store import CompactionStore, StoredCompaction
from proxy.recovery.summarize.service import Summaries
from proxy.recovery.summarize.summarizer import SummarizerError
from proxy.recovery.summarize.transport import UpstreamSummaryTransport
from proxy.recovery.windows import BoundedMap, LearnedWindows
from proxy.server.state import ProxyState
from proxy.tokens import requested_output, with_margin

__all__ = ["OverflowRecovery"]

log = logging.getLogger("tailfloor.overflow")


class OverflowRecovery:
    def __init__(self, state: ProxyState) -> None:
        self._state = state
        self._windows = LearnedWindows()
        self._marked: BoundedMap[str, str] = BoundedMap(4096)  # session -> why
        self._detectors: BoundedMap[tuple[str, ...], OverflowDetector] = BoundedMap(64)
        self._locks: BoundedMap[str, asyncio.Lock] = BoundedMap(1024)
        self.summaries = Summaries(UpstreamSummaryTransport(state.upstream), state.metrics,
                                   state.tokens)
        self._store: CompactionStore | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        # sessions with stored compactions; evictions leave extra keys, which cost a lookup
        self._sessions: set[str] = set()

    # -- life cycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Open the store: under --state, else in a private directory removed at close."""
        directory = self._state.settings.state
        if directory is not None:
            try:
                self._store = self._open_store(directory)
            except (OSError, sqlite3.Error) as exc:
                log.error("cannot use --state %s (%s): compactions will not survive a restart",
                          directory, exc)
        if self._store is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="tailfloor-state-")
            log.info("no --state directory: compactions are kept in %s until tailfloor stops",
                     self._scratch.name)
            self._store = self._open_store(Path(self._scratch.name))
        self._sessions = self._store.session_keys()

    def _open_store(self, directory: Path) -> CompactionStore:
        limits = self._state.rules.rules.store
        return CompactionStore(directory, max_per_session=limits.max_entries_per_session,
                               max_total=limits.max_entries_total)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    # -- the three phases ------------------------------------------------------------------

    # A bug in recovery must cost the recovery, never the request: each phase falls back to
    # what NoRecovery does, and says so in the log.

    async def before_send(self, chat: ChatRequest, rewrite: Rewrite,
                          headers: Mapping[str, str]) -> Rewrite:
        try:
            return await self._before_send(chat, rewrite, headers)
        except Exception:
            log.exception("overflow recovery failed before sending; the request goes as it was")
            return rewrite

    async def on_error(self, chat: ChatRequest, rewrite: Rewrite, answer: UpstreamAnswer,
                       headers: Mapping[str, str], *, attempt: int,
                       ) -> Rewrite | ErrorReply | None:
        try:
            return await self._on_error(chat, rewrite, answer, headers, attempt=attempt)
        except Exception:
            self._state.metrics.overflow.labels(outcome="failed").inc()
            log.exception("overflow recovery failed; the upstream's answer is passed on")
            return None

    def after_answer(self, chat: ChatRequest, rewrite: Rewrite, outcome: Outcome) -> None:
        try:
            self._after_answer(chat, rewrite, outcome)
        except Exception:
            log.exception("overflow checks after the answer failed")

    async def _before_send(self, chat: ChatRequest, rewrite: Rewrite,
                           headers: Mapping[str, str]) -> Rewrite:
        if self._surely_fits(chat, rewrite):
            return rewrite
        request = self._request(chat, rewrite)
        if request is None or request.policy.mode != "enforce":
            return rewrite
        prior, found = self._prior(request)
        why = self._marked.pop(request.session)
        if why is None and request.policy.preflight and (
                request.estimate(self._state.tokens, prior) > request.budget):
            why = "preflight"
        if why is not None:
            compacted = await self._compact(request, prior, headers, trigger="preflight", why=why)
            if compacted is not None:
                return compacted
        if found is None:
            return rewrite
        assert self._store is not None
        self._store.touch(found.id)
        return self._finish(request, found.summary, found.message_count, "reused")

    async def _on_error(self, chat: ChatRequest, rewrite: Rewrite, answer: UpstreamAnswer,
                        headers: Mapping[str, str], *, attempt: int,
                        ) -> Rewrite | ErrorReply | None:
        metrics = self._state.metrics
        request = self._request(chat, rewrite.origin or rewrite)
        if request is None:
            return None
        verdict = self._detector(request.policy).classify_response(
            answer.status, answer.content_type, answer.body)
        retried = attempt > 0
        if not verdict.is_overflow:
            if retried:
                metrics.overflow.labels(outcome="failed").inc()
                log.warning("the retry after an overflow failed with HTTP %d (not an "
                            "overflow); passed on", answer.status)
            return None
        if self._windows.learn(self._state.settings.upstream, chat.model, verdict.window):
            log.info("learned the context window of %s: %d tokens", chat.model, verdict.window)
            request = self._request(chat, rewrite.origin or rewrite) or request
        policy = request.policy
        if policy.on_overflow == "passthrough" or policy.mode != "enforce":
            metrics.overflow.labels(outcome="passthrough").inc()
            log.info("context overflow passed through (%s; on_overflow=%s, mode=%s)",
                     verdict.pattern, policy.on_overflow, policy.mode)
            return None
        if not retried:
            prior, found = self._prior(request)
            compacted = await self._compact(
                request, prior, headers, trigger="overflow", why=verdict.pattern or "overflow",
                scale=request.undercount(self._state.tokens, rewrite, verdict.prompt_tokens))
            if compacted is None and found is not None and rewrite.origin is None:
                # sent before a concurrent request of the session stored this compaction
                log.info("overflow: retrying with the compaction stored meanwhile")
                compacted = self._finish(request, found.summary, found.message_count,
                                         "reused", verdict="reused:overflow")
            if compacted is not None:
                return compacted
        metrics.overflow.labels(outcome="failed").inc()
        log.warning("context overflow not recoverable (%s): answering 400 with window %d",
                    "the compacted retry overflowed too" if retried else "nothing to compact",
                    request.window)
        return ErrorReply(400, context_length_exceeded_body(request.window,
                                                            verdict.prompt_tokens))

    def _after_answer(self, chat: ChatRequest, rewrite: Rewrite, outcome: Outcome) -> None:
        metrics = self._state.metrics
        if outcome.stream_error is not None:
            policy = self._policy(chat, rewrite)
            event = {"error": outcome.stream_error}
            if self._detector(policy).classify_stream_event(event).is_overflow:
                metrics.overflow.labels(outcome="mid_stream").inc()
                self._mark(chat, rewrite, "mid_stream")
                log.warning("context overflow inside the stream, passed on (bytes had reached "
                            "the client); the session's next request is compacted first")
                return
        if outcome.status < 400 and rewrite.verdict.endswith(":overflow"):
            metrics.overflow.labels(outcome="recovered").inc()
        usage = outcome.usage
        if usage is None and outcome.finish_reason is None:
            return
        window = self._known_window(chat.model)
        prompt = usage.prompt_tokens if usage is not None else None
        estimate = None
        if window and prompt is not None and len(rewrite.body) > window:
            # only then may it show a truncation: a token is at least a byte
            estimate = sent_tokens(self._state.tokens, self._state.rules.rules.model(chat.model),
                                   chat, rewrite)
        silent = check_silent_overflow(
            outcome.finish_reason, prompt, usage.completion_tokens if usage else None, window,
            estimate)
        if silent is not None:
            metrics.overflow.labels(outcome="silent").inc()
            self._mark(chat, rewrite, silent.kind)
            log.warning("silent context overflow (%s): prompt %d tokens, window %d, our "
                        "estimate %s; the session's next request is compacted first",
                        silent.kind, silent.prompt_tokens, silent.window, silent.estimate)

    # -- compaction ------------------------------------------------------------------------

    async def _compact(self, request: RecoveryRequest, prior: Prior,
                       headers: Mapping[str, str], *, trigger: str, why: str,
                       scale: float = 1.0) -> Rewrite | None:
        """Summary of everything before the tail + the tail; None when nothing can go."""
        costs = request.costs(self._state.tokens)
        cut = plan_cut(request.conversation, costs, covered=prior.covered,
                       min_tail=request.policy.min_tail_messages,
                       available=request.available(self._state.tokens, scale))
        if cut.keep <= prior.covered:
            return None
        lock = self._locks.get(request.session)
        if lock is None:
            lock = asyncio.Lock()
            self._locks.put(request.session, lock)
        contended = lock.locked()
        async with lock:
            # a concurrent request of the session may have summarized this prefix meanwhile
            found = self._prior(request)[1] if contended else None
            if found is not None and found.message_count >= cut.keep:
                return self._finish(request, found.summary, found.message_count, "reused",
                                    verdict=f"reused:{trigger}")
            material = request.conversation[prior.covered:cut.keep]
            name = request.policy.summary_model or request.chat.model
            try:
                summary = await self.summaries.make(
                    request, material, previous=prior.summary,
                    model=self._state.rules.rules.model(name), headers=headers,
                    window=request.window if name == request.chat.model else self._window(name))
            except SummarizerError as exc:
                log.warning("summarizer failed (%s: %s); dropping the %d oldest messages instead",
                            exc.kind, exc.detail[:200], cut.keep - prior.covered)
                messages = fallback_messages(request.head, request.conversation, prior,
                                             cut.keep, sum(costs[prior.covered:cut.keep]),
                                             note=request.policy.notes.summary_followed)
                return self._rewrite(request, messages, trigger, f"dropped:{trigger}",
                                     why=why, covered=cut.keep)
            assert self._store is not None
            self._sessions.add(request.session)
            if len(self._sessions) > 2 * self._state.rules.rules.store.max_entries_total:
                self._sessions = await asyncio.to_thread(self._store.session_keys)
            await asyncio.to_thread(self._store.put, request.session,
                                    request.conversation[:cut.keep], summary,
                                    sum(costs[:cut.keep]))
        return self._finish(request, summary, cut.keep, trigger, why=why)

    def _finish(self, request: RecoveryRequest, summary: str, covered: int, trigger: str, *,
                why: str = "", verdict: str | None = None) -> Rewrite:
        messages = compacted_messages(request.head, summary, request.conversation[covered:],
                                      request.policy.notes.summary_followed,
                                      runtime_line(request.conversation))
        verdict = verdict or ("reused" if trigger == "reused" else f"compacted:{trigger}")
        return self._rewrite(request, messages, trigger, verdict, why=why, covered=covered)

    def _rewrite(self, request: RecoveryRequest, messages: list[Message], trigger: str,
                 verdict: str, *, why: str, covered: int) -> Rewrite:
        """The Rewrite that goes upstream, its usage adjustment, the metrics and the log line."""
        state, base = self._state, request.base
        encoding = request.spec.encoding
        before = sum(request.costs(state.tokens))
        after = sum(state.tokens.per_message(messages[len(request.head):], encoding))
        # in the upstream's units as far as we can tell: non-OpenAI tokenizers count more
        removed = with_margin(max(before - after, 0), request.spec.margin)
        state.metrics.compactions.labels(trigger=trigger).inc()
        state.metrics.tokens_removed.inc(removed)
        adjust = None
        if request.policy.report_usage == "client":
            floor = base.adjust or UsageAdjustment()
            adjust = UsageAdjustment(added=floor.added, removed=floor.removed + removed,
                                     window=request.window)
        if trigger != "reused":
            kept = len(request.conversation) - covered
            log.info("%s (%s): session %s, %d messages replaced, %d kept raw, about %d tokens "
                     "removed, window %d", verdict, why, request.session, covered, kept,
                     removed, request.window,
                     extra={"verdict": verdict, "reason": why, "session": request.session,
                            "replaced": covered, "kept": kept, "tokens_removed": removed,
                            "window": request.window})
        # the floor's pass-through verdicts ("none; reason=...") mean it added nothing
        floor_added = base.verdict.split(";", 1)[0] not in ("none", "")
        label = f"{base.verdict}+{verdict}" if floor_added else verdict
        return Rewrite(body=orjson.dumps({**request.chat.body, "messages": messages}),
                       verdict=label, adjust=adjust, messages=tuple(messages),
                       session_key=base.session_key, origin=base)

    # -- what a request is -----------------------------------------------------------------

    def _request(self, chat: ChatRequest, base: Rewrite) -> RecoveryRequest | None:
        if self._store is None or is_summarization(chat.body):
            return None  # an agent's own compaction call is never touched
        rules = self._state.rules.rules
        policy = rules.resolve(chat.agent_id, chat.model, base.session_key)
        return RecoveryRequest.of(chat, base, policy, rules.model(chat.model),
                                  self._window(chat.model))

    def _surely_fits(self, chat: ChatRequest, rewrite: Rewrite) -> bool:
        """Nothing stored or marked anywhere and the body smaller in bytes than the budget in
        tokens: a text token covers at least one byte, so the request cannot need compacting,
        and the per-request cost of a small request stays a few microseconds. Images and audio
        cost tokens their bytes do not show, so those requests take the full path."""
        if self._sessions or len(self._marked) or self._store is None:
            return False
        body = rewrite.body
        if b'"image_url"' in body or b'"input_audio"' in body:
            return False
        policy = self._policy(chat, rewrite)
        return len(body) + requested_output(chat.body) < policy.budget(self._window(chat.model))

    def _policy(self, chat: ChatRequest, rewrite: Rewrite) -> Policy:
        return self._state.rules.rules.resolve(chat.agent_id, chat.model, rewrite.session_key)

    def _window(self, model: str) -> int:
        learned = self._windows.window(self._state.settings.upstream, model)
        return learned or self._state.rules.rules.model(model).context_window

    def _known_window(self, model: str) -> int | None:
        """The window when it is known rather than guessed: learned, or a model table row that
        names the model. The unknown-model default must not call a good answer an overflow."""
        learned = self._windows.window(self._state.settings.upstream, model)
        rules = self._state.rules.rules
        spec = rules.model(model)
        return learned or (None if spec is rules.unknown_model else spec.context_window)

    def _prior(self, request: RecoveryRequest) -> tuple[Prior, StoredCompaction | None]:
        """What is summarized already: a stored compaction of this prefix, else the agent's."""
        assert self._store is not None
        if request.session not in self._sessions:  # no lookup (and no hashing) for most
            return Prior.of(request.conversation), None
        found = self._store.find_for(request.conversation, request.session)
        if found is not None:
            return Prior(found.message_count, found.summary), found
        return Prior.of(request.conversation), None

    def _detector(self, policy: Policy) -> OverflowDetector:
        """The detector for the rules' extra patterns, compiled once per set of patterns."""
        key = tuple(p.pattern for p in policy.overflow_patterns)
        detector = self._detectors.get(key)
        if detector is None:
            detector = OverflowDetector(key)
            self._detectors.put(key, detector)
        return detector

    def _mark(self, chat: ChatRequest, rewrite: Rewrite, why: str) -> None:
        request = self._request(chat, rewrite.origin or rewrite)
        if request is not None:
            self._marked.put(request.session, why)

"""One chat request as overflow recovery sees it: its parts, its session, its token budget.

Pure: the token counter is handed in; nothing is sent or stored here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from proxy.chat import ChatRequest, Draft
from proxy.context import RequestContext
from proxy.policy.records import ModelSpec, Policy
from proxy.recovery.credential import CredentialScopes
from proxy.recovery.message_chain import KeptFingerprints, message_fingerprint
from proxy.recovery.plan import Prior
from proxy.telemetry.tracecontext import TraceContext
from proxy.tokens import REPLY_PRIMING, TokenCounter, requested_output, with_margin
from proxy.values import frozen_value
from proxy.wire.content import head_length
from proxy.wire.summary import summary_message

__all__ = ["RecoveryRequest", "derived_session_key", "sent_tokens"]

Message = dict[str, Any]
_MIN_SUMMARY_TOKENS = 256
_MIN_SCALE = 0.25  # never believe our count is off by more than 4x


def sent_tokens(tokens: TokenCounter, spec: ModelSpec, chat: ChatRequest,
                messages: Sequence[Any] | None) -> int:
    """Our count of what was sent (margin and requested output included)."""
    body = {**chat.body, "messages": list(messages or [])}
    return tokens.request(body, spec.encoding, spec.margin).total


def derived_session_key(model: str, head: Sequence[Message], conversation: Sequence[Message],
                        kept: KeptFingerprints | None = None) -> str:
    """A session key for requests that name no session: model, system prompt and the first
    conversation message, which an agent repeats in every request until it compacts itself
    (its own summary then opens the conversation, and the key changes with it)."""
    digest = hashlib.blake2b(model.encode(), digest_size=12)
    fingerprint = kept.of if kept is not None else message_fingerprint
    for message in (*head, *conversation[:1]):
        digest.update(fingerprint(message).encode())
    return "auto:" + digest.hexdigest()


@frozen_value
class RecoveryRequest:
    """A request as recovery works on it, built once per request from its context and what
    the floor made of it (never from an earlier compaction)."""

    ctx: RequestContext
    draft: Draft
    session: str  # the session, as logs and reports name it
    head: list[Message]  # leading system/developer messages
    conversation: list[Message]  # the rest
    # What the store, the locks and the overflow marks know it by: the session and a keyed
    # hash of its credential (proxy/recovery/credential.py).
    key: str
    older_keys: tuple[str, ...] = ()  # the same, under a shared store's previous key
    # Spans are exported: the request's trace, which the summarizer's calls join.
    trace: TraceContext | None = None

    @classmethod
    def of(cls, ctx: RequestContext, draft: Draft, kept: KeptFingerprints | None = None,
           scopes: CredentialScopes | None = None, trace: TraceContext | None = None
           ) -> RecoveryRequest | None:
        """None for a request recovery leaves alone (no usable messages)."""
        messages = draft.message_list(ctx.chat)
        if not messages or not all(isinstance(m, dict) for m in messages):
            return None
        head = list(messages[:head_length(messages)])
        conversation = list(messages[len(head):])
        # A session the request only claims (an id in a header, from a tenant that does not
        # vouch for it) does not name the store's key: a client could otherwise fill another
        # session's slots and push its summaries out, on every replica sharing the store.
        # Nor does a request that did not prove it is a keyed agent (ctx.guarded).
        named = ctx.session if ctx.lineage.trusted and not ctx.guarded else None
        session = named or derived_session_key(ctx.chat.model, head, conversation, kept)
        if scopes is None or not scopes.keys:
            return cls(ctx, draft, session, head, conversation, session, (), trace)
        hashes = scopes.of(ctx.headers)
        if hashes is None:  # no credential: the session alone, under every key
            return cls(ctx, draft, session, head, conversation, session,
                       (session,) * (len(scopes.keys) - 1), trace)
        return cls(ctx, draft, session, head, conversation, f"{session}~{hashes[0]}",
                   tuple(f"{session}~{h}" for h in hashes[1:]), trace)

    @property
    def chat(self) -> ChatRequest:
        return self.ctx.chat

    def material(self, start: int, end: int) -> list[Message]:
        """Conversation messages ``start:end`` for the summarizer: without the pins the
        floor put in, which stay raw after the summary (``compacted.summarized``)."""
        head = len(self.head)
        return [m for i, m in enumerate(self.conversation[start:end], start=start)
                if self.draft.origin(head + i).provenance != "pinned"]

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def spec(self) -> ModelSpec:
        return self.ctx.spec

    @property
    def window(self) -> int:
        return self.ctx.window

    @property
    def budget(self) -> int:
        """Tokens the whole request may use (window minus the reserve)."""
        return self.policy.token_budget(self.window)

    @property
    def summary_tokens(self) -> int:
        """Room kept for a summary, and the summarizer's output bound."""
        cap = max(self.budget // 4, _MIN_SUMMARY_TOKENS)
        return min(self.policy.summary_max_tokens, cap)

    def costs(self, tokens: TokenCounter) -> list[int]:
        """Tokens of each conversation message, without margin."""
        return tokens.per_message(self.conversation, self.spec.encoding)

    def _fixed(self, tokens: TokenCounter) -> int:
        head = sum(tokens.per_message(self.head, self.spec.encoding))
        return REPLY_PRIMING + head + tokens.tools(self.chat.body.get("tools"),
                                                   self.spec.encoding)

    def available(self, tokens: TokenCounter, scale: float = 1.0) -> int:
        """Conversation tokens (without margin) the budget leaves next to a summary;
        ``scale`` < 1 when the upstream counts more than we do."""
        output = requested_output(self.chat.body)
        room = math.floor((self.budget - output) * scale / (1.0 + self.spec.margin))
        return room - self._fixed(tokens) - self.summary_tokens

    @property
    def requested_output(self) -> int:
        """The output limit the request asks for (0: none)."""
        return requested_output(self.chat.body)

    def prompt_estimate(self, tokens: TokenCounter, prior: Prior) -> int:
        """Prompt tokens of the request once ``prior`` replaces its prefix (margin included,
        output not)."""
        conversation = sum(tokens.per_message(self.conversation[prior.covered:],
                                              self.spec.encoding))
        if prior.covered and prior.summary is not None:
            wrapped = summary_message(prior.summary, self.policy.notes.summary_followed)
            conversation += tokens.message(wrapped, self.spec.encoding)
        return with_margin(self._fixed(tokens) + conversation, self.spec.margin)

    def estimate(self, tokens: TokenCounter, prior: Prior) -> int:
        """Tokens of the request once ``prior`` replaces its prefix (margin, output included)."""
        return self.prompt_estimate(tokens, prior) + self.requested_output

    def undercount(self, tokens: TokenCounter, failed: Sequence[Message] | None,
                   upstream_prompt: int | None) -> float:
        """How much smaller our count is than the upstream's, when the error says how many
        tokens what overflowed had (``failed``: a compaction recovery made, else the floor's
        draft): the retry is then cut to fit by the upstream's measure, not ours, so a model
        whose tokenizer counts more than the rules' margin allows still gets a retry that
        fits."""
        if not upstream_prompt:
            return 1.0
        ours = with_margin(self.sent_prompt(tokens, failed), self.spec.margin)
        return min(1.0, max(_MIN_SCALE, ours / upstream_prompt))

    def sent_prompt(self, tokens: TokenCounter, sent: Sequence[Message] | None) -> int:
        """Our count of the prompt sent (``sent``: a compaction's messages, else the floor's
        draft), without margin: what the upstream's own count is compared with."""
        messages = sent if sent is not None else self.draft.message_list(self.chat)
        body = {"messages": list(messages or []), "tools": self.chat.body.get("tools")}
        counted = tokens.request(body, self.spec.encoding, 0.0)
        return counted.messages + counted.tools

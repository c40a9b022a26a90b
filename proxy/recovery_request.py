"""One chat request as overflow recovery sees it: its parts, its session, its token budget.

Pure: the token counter is handed in; nothing is sent or stored here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.compaction.fingerprint import message_fingerprint
from proxy.compaction.plan import Prior, head_length
from proxy.compaction.prompt import summary_message
from proxy.model import ChatRequest, Rewrite
from proxy.rules import ModelSpec, Policy
from proxy.tokens import REPLY_PRIMING, TokenCounter, requested_output, with_margin

__all__ = ["RecoveryRequest", "derived_session_key"]

Message = dict[str, Any]
_MIN_SUMMARY_TOKENS = 256


def derived_session_key(model: str, head: Sequence[Message],
                        conversation: Sequence[Message]) -> str:
    """A session key for requests that name no session: model, system prompt and the first
    conversation message, which an agent repeats in every request until it compacts itself
    (its own summary then opens the conversation, and the key changes with it)."""
    digest = hashlib.blake2b(model.encode(), digest_size=12)
    for message in (*head, *conversation[:1]):
        digest.update(message_fingerprint(message).encode())
    return "auto:" + digest.hexdigest()


@dataclass(frozen=True, slots=True)
class RecoveryRequest:
    chat: ChatRequest
    base: Rewrite  # what recovery starts from: the floor's rewrite, never its own output
    policy: Policy
    spec: ModelSpec
    window: int  # learned from the upstream, else the rules' model table
    session: str
    head: list[Message]  # leading system/developer messages
    conversation: list[Message]  # the rest

    @classmethod
    def of(cls, chat: ChatRequest, base: Rewrite, policy: Policy, spec: ModelSpec,
           window: int) -> RecoveryRequest | None:
        """None for a request recovery leaves alone (no usable messages)."""
        messages: Sequence[Any] | None = base.messages
        if messages is None:
            raw = chat.body.get("messages")
            messages = raw if isinstance(raw, list) else None
        if not messages or not all(isinstance(m, dict) for m in messages):
            return None
        head = list(messages[:head_length(messages)])
        conversation = list(messages[len(head):])
        session = base.session_key or derived_session_key(chat.model, head, conversation)
        return cls(chat, base, policy, spec, window, session, head, conversation)

    @property
    def budget(self) -> int:
        """Tokens the whole request may use (window minus the reserve)."""
        return self.policy.budget(self.window)

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

    def estimate(self, tokens: TokenCounter, prior: Prior) -> int:
        """Tokens of the request once ``prior`` replaces its prefix (margin, output included)."""
        conversation = sum(tokens.per_message(self.conversation[prior.covered:],
                                              self.spec.encoding))
        if prior.covered and prior.summary is not None:
            conversation += tokens.message(summary_message(prior.summary), self.spec.encoding)
        return (with_margin(self._fixed(tokens) + conversation, self.spec.margin)
                + requested_output(self.chat.body))

"""The per-application state the handlers share (made by build_app, never a module global)."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from proxy.metrics import Metrics
from proxy.model import ChatRequest, ErrorReply, Outcome, Rewrite, UpstreamAnswer
from proxy.policy.files import RulesHolder
from proxy.settings import Settings
from proxy.tokens import TokenCounter
from proxy.transcripts.service import TranscriptService
from proxy.upstream.pool import Upstream


class Rewriter(Protocol):
    """Decides what a chat request becomes before it goes upstream (the floor, issue 4)."""

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Rewrite: ...


class PassThrough:
    """The rewriter used when no transcripts are followed: requests go out as sent."""

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Rewrite:
        return Rewrite(body=chat.raw)


class Recovery(Protocol):
    """Context overflow handling around the upstream call (issue 5)."""

    async def before_send(self, chat: ChatRequest, rewrite: Rewrite,
                          headers: Mapping[str, str]) -> Rewrite:
        """Reuse a stored compaction or compact ahead of time; else return ``rewrite``."""
        ...

    async def on_error(self, chat: ChatRequest, rewrite: Rewrite, answer: UpstreamAnswer,
                       headers: Mapping[str, str], *, attempt: int,
                       ) -> Rewrite | ErrorReply | None:
        """An error answer before any byte reached the client. ``attempt`` 0 may return a
        Rewrite to send once more; any attempt may return the answer to give instead;
        None passes the upstream's answer through."""
        ...

    def after_answer(self, chat: ChatRequest, rewrite: Rewrite, outcome: Outcome) -> None:
        """A complete answer: look for silent overflow."""
        ...


class NoRecovery:
    async def before_send(self, chat: ChatRequest, rewrite: Rewrite,
                          headers: Mapping[str, str]) -> Rewrite:
        return rewrite

    async def on_error(self, chat: ChatRequest, rewrite: Rewrite, answer: UpstreamAnswer,
                       headers: Mapping[str, str], *, attempt: int,
                       ) -> Rewrite | ErrorReply | None:
        return None

    def after_answer(self, chat: ChatRequest, rewrite: Rewrite, outcome: Outcome) -> None:
        return None


@dataclass
class ProxyState:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
    rules: RulesHolder = field(default_factory=lambda: RulesHolder(None))
    tokens: TokenCounter = field(default_factory=TokenCounter)
    transcripts: TranscriptService | None = None
    rewriter: Rewriter = field(default_factory=PassThrough)
    recovery: Recovery = field(default_factory=NoRecovery)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("tailfloor"))
    draining: bool = False
    ready: bool = False
    # Set once the upstream refused stream_options; from then on streams go out as sent.
    stream_options_rejected: bool = False
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _id_prefix: str = field(default_factory=lambda: os.urandom(4).hex())

    def next_request_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids):x}"


STATE_KEY = web.AppKey("tailfloor_state", ProxyState)

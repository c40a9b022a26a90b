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
from proxy.model import ChatRequest, Rewrite
from proxy.settings import Settings
from proxy.upstream import Upstream


class Rewriter(Protocol):
    """Decides what a chat request becomes before it goes upstream (the floor, issue 4)."""

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Rewrite: ...


class PassThrough:
    """The rewriter used when no transcripts are followed: requests go out as sent."""

    def rewrite(self, chat: ChatRequest, headers: Mapping[str, str]) -> Rewrite:
        return Rewrite(body=chat.raw)


@dataclass
class ProxyState:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
    rewriter: Rewriter = field(default_factory=PassThrough)
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

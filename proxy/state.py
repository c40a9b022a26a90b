"""The per-application state the handlers share (made by build_app, never a module global)."""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field

from aiohttp import web

from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.upstream import Upstream


@dataclass
class ProxyState:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
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

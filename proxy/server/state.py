"""The per-application state the handlers share (made by build_app, never a module global)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from proxy.context import ContextBuilder
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.floor.stage import Floor
from proxy.identity.sessions import SessionFinder
from proxy.inspector.store import InspectorStore
from proxy.metrics import Metrics
from proxy.policy.files import RulesHolder
from proxy.recovery.stage import Recovery
from proxy.server.body_prefixes import RecentBodies
from proxy.server.connections import CappedSite
from proxy.server.draining import BodyReads
from proxy.server.floor_lane import FloorLane
from proxy.server.held_bodies import BodyBudget
from proxy.server.offload import WorkerPool
from proxy.server.record import Recorder
from proxy.settings import Settings
from proxy.telemetry.sampling import TraceSampler
from proxy.tokens import TokenCounter
from proxy.transcripts.service import TranscriptService
from proxy.upstream.pool import Upstream
from proxy.upstream.stream_options import StreamOptionsMemory

if TYPE_CHECKING:  # the Redis client loads only with --store (0.15 s of start-up)
    from proxy.replicas.service import SharedStore


@dataclass
class ProxyState:
    settings: Settings
    metrics: Metrics
    upstream: Upstream
    rules: RulesHolder
    tokens: TokenCounter
    windows: LearnedWindows
    ratios: TokenRatios
    offload: WorkerPool
    recovery: Recovery
    record: Recorder
    models: ModelFactsResolver
    floor: Floor
    contexts: ContextBuilder
    floor_lane: FloorLane
    transcripts: TranscriptService | None = None
    sessions: SessionFinder | None = None
    stream_options: StreamOptionsMemory = field(default_factory=StreamOptionsMemory)
    bodies: BodyBudget = field(default_factory=lambda: BodyBudget(48 * 1024 * 1024))
    # Counts of chat bodies seen lately, so the next ones are counted past what they share.
    recent_bodies: RecentBodies = field(default_factory=RecentBodies)
    # One large body's bytes worked on at a time (server/parsing.py).
    parsing: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    shared: SharedStore | None = None  # --store: what replicas share
    inspector: InspectorStore | None = None  # the kept requests (--inspect-requests)
    connections: CappedSite | None = None  # the proxy port's listener, once it listens
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("tailfloor"))
    draining: bool = False
    body_reads: BodyReads = field(default_factory=BodyReads)  # bodies arriving (drain)
    # Spans are exported (by this sampler): each attempt sends its own traceparent.
    traces: TraceSampler | None = None
    ready: bool = False
    # serve sets this while its listeners start: ready only once both ports accept, so a
    # probe of one port never sees ready while the other still refuses.
    starting: bool = False
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _id_prefix: str = field(default_factory=lambda: os.urandom(4).hex())

    def next_request_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids):x}"


STATE_KEY = web.AppKey("tailfloor_state", ProxyState)

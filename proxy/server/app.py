"""Building the aiohttp application and running it.

State lives in objects made here and reached through ``web.AppKey``; background work starts
and stops through ``cleanup_ctx`` so tests and the server share one life cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from proxy import telemetry
from proxy.context import ContextBuilder
from proxy.facts.learned import LearnedWindows, TokenRatios
from proxy.facts.resolve import ModelFactsResolver
from proxy.floor.stage import Floor
from proxy.identity.prompt_prints import Fingerprints
from proxy.identity.sessions import SessionFinder
from proxy.inspector.store import InspectorStore
from proxy.metrics import Metrics
from proxy.policy.agent_keys import AgentKeys
from proxy.policy.files import RulesHolder, watch_rules
from proxy.policy.prices import PriceList
from proxy.recovery.compaction_store import LocalCompactions
from proxy.recovery.credential import CredentialScopes, scope_keys
from proxy.recovery.stage import Recovery
from proxy.recovery.summarize.transport import UpstreamSummaryTransport
from proxy.server import inspector_routes
from proxy.server import routes as handlers
from proxy.server.admin_token import AdminToken, token_guard
from proxy.server.cache_fill import cache_fills
from proxy.server.floor_lane import FloorLane
from proxy.server.guard import last_guard
from proxy.server.inspector_sink import InspectorSink
from proxy.server.offload import WorkerPool
from proxy.server.record import Recorder, ReportSinkWithShutdown
from proxy.server.state import STATE_KEY, ProxyState
from proxy.settings import Settings
from proxy.tokens import Encodings, TokenCounter
from proxy.transcripts.cache_bounds import cache_bounds
from proxy.transcripts.discovery import default_roots
from proxy.transcripts.service import TranscriptService
from proxy.upstream.pool import Opener, Upstream

if TYPE_CHECKING:  # the Redis client loads only with --store (0.15 s of start-up)
    from proxy.replicas.service import SharedStore

log = logging.getLogger("tailfloor")
TELEMETRY_KEY = web.AppKey("tailfloor_telemetry", ReportSinkWithShutdown)


def build_app(settings: Settings, registry: CollectorRegistry | None = None, *,
              upstream_opener: Opener | None = None, name: str = "tailfloor"
              ) -> web.Application:
    """The application; raises ``RulesError`` when the rules directory is invalid.
    ``upstream_opener``: how upstream connections are opened (TCP by default); ``name``
    prefixes its worker threads."""
    metrics = Metrics(registry, label_cap=settings.label_cap)
    upstream = Upstream(settings.upstream, settings.connect_timeout, settings.read_timeout,
                        ca_file=str(settings.upstream_ca) if settings.upstream_ca else None,
                        opener=upstream_opener)
    rules = RulesHolder.open(settings.rules, metrics)
    tokens = TokenCounter(Encodings(background=True),
                          cache_bounds(settings.session_cache_bytes).token_counts)
    windows = LearnedWindows()
    ratios = TokenRatios()
    offload = WorkerPool(name=f"{name}-work")
    models = ModelFactsResolver(windows, ratios, settings.upstream)
    recovery = Recovery(rules=rules, tokens=tokens, models=models,
                        transport=UpstreamSummaryTransport(upstream), offload=offload)
    roots = list(settings.sessions) or default_roots(os.environ, Path.home())
    transcripts = TranscriptService(roots, metrics, cache_bytes=settings.session_cache_bytes,
                                    scan_workers=settings.scan_workers)
    prints = Fingerprints()
    # Each --sessions root is a tenant; the default roots are one user's two agent homes.
    sessions = SessionFinder(transcripts.catalog, prints=prints,
                             single_tenant=len(settings.sessions) <= 1,
                             resolve_root=_resolved_root)
    def prices() -> PriceList:
        return rules.rules.prices

    sink = telemetry.start(settings.telemetry, metrics, settings.upstream, prices) \
        if settings.telemetry is not None else None
    inspector = InspectorStore(settings.inspect_requests, settings.inspect_memory_bytes) \
        if settings.inspect_requests > 0 else None
    state = ProxyState(
        settings=settings, metrics=metrics, upstream=upstream, rules=rules, tokens=tokens,
        windows=windows, ratios=ratios, offload=offload, recovery=recovery,
        record=Recorder(metrics, [sink] if sink is not None else [], prices,
                        trail_sinks=[] if inspector is None else [InspectorSink(inspector)],
                        upstream=settings.upstream),
        models=models, floor=Floor(transcripts.catalog, tokens, prints),
        contexts=ContextBuilder(models, sessions, AgentKeys()),
        floor_lane=FloorLane(settings.floor_wait_ms / 1000 if settings.floor_wait_ms else None,
                             name=f"{name}-floor"),
        transcripts=transcripts,
        sessions=sessions, inspector=inspector)
    metrics.report_caches(cache_fills(transcripts.catalog, tokens, inspector))
    # aiohttp enforces the body limit for request.read(); +1 so the handler's own check answers.
    # Bodies arrive as sent: proxy/server/body.py decodes compressed ones under one rule.
    app = web.Application(client_max_size=settings.max_body_bytes + 1,
                          handler_args={"auto_decompress": False}, middlewares=[last_guard])
    state.bodies.total = settings.max_buffered_bytes
    app[STATE_KEY] = state
    if sink is not None:
        state.traces = sink.traces
        app[TELEMETRY_KEY] = sink
        app.cleanup_ctx.append(_telemetry_ctx)
    app.cleanup_ctx.append(_transcripts_ctx)
    app.cleanup_ctx.append(_rules_ctx)
    app.cleanup_ctx.append(_agent_keys_ctx)
    app.cleanup_ctx.append(_upstream_ctx)
    app.cleanup_ctx.append(_recovery_ctx)
    router = app.router
    # Probes and scrapes keep working on the proxy port; introspection is admin-only.
    router.add_get("/healthz", handlers.healthz)
    router.add_get("/readyz", handlers.readyz)
    router.add_get("/metrics", handlers.metrics)
    # [\s\S]: a decoded path may hold a newline, which '.' would leave to aiohttp's own
    # plain-text 404.
    router.add_route("*", r"/tailfloor/{tail:[\s\S]*}", handlers.not_here)
    router.add_route("*", r"/{tail:[\s\S]*}", handlers.route)
    return app


async def _telemetry_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    # Flushes what is queued, bounded by OTEL_EXPORTER_OTLP_TIMEOUT: off the loop, so the
    # other cleanups go on meanwhile.
    await asyncio.to_thread(app[TELEMETRY_KEY].shutdown)


def _resolved_root(root: str) -> str:
    """A root named in ``[[agents]]``, in the form the tracker records (resolved once)."""
    return str(Path(root).expanduser().resolve())


def build_admin_app(state: ProxyState) -> web.Application:
    """The admin listener: health, readiness, metrics and ``/tailfloor/*`` introspection.

    It shares the proxy's state but none of its life cycle (the proxy app owns that). With
    ``--admin-token-file`` every route but the probes asks for the token."""
    token_file = state.settings.admin_token_file
    guards: list[Middleware] = [last_guard]
    if token_file is not None:
        guards.append(token_guard(AdminToken(token_file)))
    admin = web.Application(client_max_size=64 * 1024, middlewares=guards)
    admin[STATE_KEY] = state
    router = admin.router
    router.add_get("/healthz", handlers.healthz)
    router.add_get("/readyz", handlers.readyz)
    router.add_get("/metrics", handlers.metrics)
    if state.inspector is not None:
        inspector_routes.add_routes(router)
    if state.settings.introspection:
        router.add_get("/tailfloor/sessions", handlers.sessions)
    else:
        router.add_route("*", r"/tailfloor/{tail:[\s\S]*}", handlers.not_here)
    return admin


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    await state.upstream.start()
    state.ready = True
    yield
    state.ready = False
    await state.upstream.close()


async def _recovery_ctx(app: web.Application) -> AsyncIterator[None]:
    """The compaction store: under --state, else in a private directory removed at stop."""
    state = app[STATE_KEY]
    scratch: tempfile.TemporaryDirectory[str] | None = None
    directory = state.settings.state
    opened = False
    if directory is not None:
        try:
            await state.offload(state.recovery.open, directory)
            opened = True
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot use --state %s (%s): compactions will not survive a restart",
                      directory, exc)
    if not opened:
        scratch = tempfile.TemporaryDirectory(prefix="tailfloor-state-")
        log.info("no --state directory: compactions are kept in %s until tailfloor stops",
                 scratch.name)
        await state.offload(state.recovery.open, Path(scratch.name))
    store = state.settings.store
    state.recovery.scopes = CredentialScopes(await state.offload(
        scope_keys, store.keys if store is not None else None, directory if opened else None))
    shared = await _shared_store(state)
    yield
    if shared is not None:
        state.shared = None
        await shared.close()
    await state.recovery.close()
    if scratch is not None:
        scratch.cleanup()
    state.offload.close()
    state.floor_lane.close()


async def _shared_store(state: ProxyState) -> SharedStore | None:
    """Compactions and learned facts shared with the other replicas (``--store``); the
    embedded store under it stands in while the shared one does not answer."""
    url, local = state.settings.store, state.recovery.store
    if url is None:
        return None
    if not isinstance(local, LocalCompactions):
        log.error("--store %s is not used: the local compaction store did not open", url)
        return None
    errors = state.metrics.store_errors.labels(store="redis", kind="failed")
    forged = state.metrics.store_errors.labels(store="redis", kind="forged")
    assert state.sessions is not None
    if not url.keys:
        log.warning("--store %s: no TAILFLOOR_STORE_KEY_FILE, so what the shared store holds "
                    "is trusted as it is (anyone who can write to it can plant summaries, "
                    "windows and fingerprints)", url)
    from proxy.replicas.service import SharedStore  # the Redis client: only with --store

    shared = SharedStore(url, local=local, offload=state.offload, windows=state.windows,
                         ratios=state.ratios,
                         stream_options=state.stream_options, prints=state.sessions.prints,
                         on_error=errors.inc, on_forged=forged.inc,
                         max_per_session=state.rules.rules.store.max_entries_per_session)
    state.recovery.use(shared.compactions, shared.lock)
    await shared.start()
    state.shared = shared
    return shared


async def _transcripts_ctx(app: web.Application) -> AsyncIterator[None]:
    """Indexing runs in the background: the listeners open at once (probes answer, requests
    pass through, counted as ``indexing``) and ``/readyz`` waits for the first scan."""
    service = app[STATE_KEY].transcripts
    if service is not None:
        service.begin()
    yield
    if service is not None:
        await service.stop()


KEYS_REFRESH = 2.0  # seconds between looks at the agents' key files


async def _agent_keys_ctx(app: web.Application) -> AsyncIterator[None]:
    """The agents' key files, read before the first request and kept current: a rotated or
    new key file applies within seconds, off the event loop."""
    state = app[STATE_KEY]
    keys = state.contexts.keys

    async def follow() -> None:
        while True:
            await asyncio.sleep(KEYS_REFRESH)
            try:
                await state.offload(keys.refresh, state.rules.rules)
            except Exception:  # a bug here must not stop the keys being followed
                log.exception("reading the agents' key files failed; trying again")

    await state.offload(keys.refresh, state.rules.rules)
    task = asyncio.create_task(follow(), name="agent-keys")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _rules_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    stop = asyncio.Event()
    task = asyncio.create_task(watch_rules(state.rules, stop))
    yield
    stop.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

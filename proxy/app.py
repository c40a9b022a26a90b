"""Building the aiohttp application and running it.

State lives in objects made here and reached through ``web.AppKey``; background work starts
and stops through ``cleanup_ctx`` so tests and the server share one life cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy import handlers, logs
from proxy.metrics import Metrics
from proxy.overflow import OverflowRecovery
from proxy.rewrite import FloorRewriter
from proxy.rules_parse import RulesError
from proxy.rules_watch import RulesHolder, watch_rules
from proxy.settings import Settings
from proxy.state import STATE_KEY, ProxyState
from proxy.tokens import Encodings, TokenCounter
from proxy.transcripts.discovery import default_roots
from proxy.transcripts.service import TranscriptService
from proxy.upstream import Upstream

log = logging.getLogger("tailfloor")

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


def build_app(settings: Settings, registry: CollectorRegistry | None = None) -> web.Application:
    """The application; raises ``RulesError`` when the rules directory is invalid."""
    metrics = Metrics(registry, label_cap=settings.label_cap)
    upstream = Upstream(settings.upstream, settings.connect_timeout, settings.read_timeout,
                        ca_file=str(settings.upstream_ca) if settings.upstream_ca else None)
    rules = RulesHolder.open(settings.rules, metrics)
    tokens = TokenCounter(Encodings(background=True))
    state = ProxyState(settings=settings, metrics=metrics, upstream=upstream, rules=rules,
                       tokens=tokens)
    state.recovery = OverflowRecovery(state)
    # aiohttp enforces the body limit for request.read(); +1 so the handler's own check answers.
    app = web.Application(client_max_size=settings.max_body_bytes + 1, handler_args={})
    app[STATE_KEY] = state
    roots = list(settings.sessions) or default_roots(os.environ, Path.home())
    state.transcripts = TranscriptService(roots, metrics)
    state.rewriter = FloorRewriter(state.rules, state.tokens, state.transcripts.catalog, metrics)
    app.cleanup_ctx.append(_transcripts_ctx)
    app.cleanup_ctx.append(_rules_ctx)
    app.cleanup_ctx.append(_upstream_ctx)
    app.cleanup_ctx.append(_recovery_ctx)
    router = app.router
    router.add_get("/healthz", handlers.healthz)
    router.add_get("/readyz", handlers.readyz)
    router.add_get("/metrics", handlers.metrics)
    router.add_get("/tailfloor/sessions", handlers.sessions)
    for path in CHAT_PATHS:
        router.add_post(path, handlers.chat_completions)
        router.add_post("/agents/{agent}" + path, handlers.chat_completions)
    router.add_route("*", "/agents/{agent}/{tail:.*}", handlers.passthrough)
    router.add_route("*", "/{tail:.*}", handlers.passthrough)
    return app


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    await state.upstream.start()
    state.ready = True
    yield
    state.ready = False
    await state.upstream.close()


async def _recovery_ctx(app: web.Application) -> AsyncIterator[None]:
    recovery = app[STATE_KEY].recovery
    if isinstance(recovery, OverflowRecovery):
        await asyncio.to_thread(recovery.open)
    yield
    if isinstance(recovery, OverflowRecovery):
        await asyncio.to_thread(recovery.close)


async def _transcripts_ctx(app: web.Application) -> AsyncIterator[None]:
    service = app[STATE_KEY].transcripts
    if service is not None:
        await service.start()
    yield
    if service is not None:
        await service.stop()


async def _rules_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    stop = asyncio.Event()
    task = asyncio.create_task(watch_rules(state.rules, stop))
    yield
    stop.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def serve(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT, then drain for the grace period."""
    logs.configure(settings.log_format, settings.log_level, settings.access_log)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        log.warning("uvloop is not available; using the default event loop")
        return asyncio.run(_serve(settings))
    return uvloop.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    try:
        app = build_app(settings)
    except RulesError as exc:
        log.error("%s", exc)
        return 2
    state = app[STATE_KEY]
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           handler_cancellation=True, shutdown_timeout=settings.shutdown_grace)
    await runner.setup()
    site = web.TCPSite(runner, settings.listen_host, settings.listen_port, backlog=1024,
                       reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s: %s", settings.listen, exc.strerror or exc)
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    log.info("listening on http://%s, upstream %s", settings.listen, settings.upstream,
             extra={"listen": settings.listen, "upstream": settings.upstream})
    await stop.wait()
    state.draining = True
    log.info("draining: in-flight requests have %.0f s to finish", settings.shutdown_grace)
    await runner.cleanup()
    log.info("stopped")
    return 0

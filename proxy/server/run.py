"""Running the server: the listeners, the health process, the signals and the drain."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys

from aiohttp import web

from proxy import logs
from proxy.policy.parse import RulesError
from proxy.server import protocol_errors
from proxy.server.allocator import give_back_large_blocks, trim_after_work
from proxy.server.app import build_admin_app, build_app
from proxy.server.connections import CappedSite, default_cap
from proxy.server.full_collections import freeze_survivors, unfreeze_now_and_then
from proxy.server.health import HealthProcess
from proxy.server.listen_errors import cannot_listen
from proxy.server.routes import readiness
from proxy.server.state import STATE_KEY, ProxyState
from proxy.settings import Settings

__all__ = ["serve"]

log = logging.getLogger("tailfloor")


def serve(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT, then drain for the grace period."""
    logs.configure(settings.log_format, settings.log_level, settings.access_log)
    # Heavy work runs in worker threads; a short switch interval hands the GIL back to the
    # event loop every millisecond (default 5 ms), so other requests stay fast meanwhile.
    sys.setswitchinterval(0.001)
    # A full garbage collection holds the GIL for as long as it walks every live object: a
    # large request's parse would trigger one every few hundred thousand allocations. Full
    # collections ten times rarer; what start-up made (rules, tables, the catalog read at
    # start) is frozen out of them (see _serve_with), and so is what survived each one.
    gc.set_threshold(700, 10, 100)
    freeze_survivors()
    give_back_large_blocks()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        log.warning("uvloop is not available; using the default event loop")
        return asyncio.run(_serve(settings))
    return uvloop.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    health: HealthProcess | None = None
    if settings.health_host is not None:
        try:
            health = HealthProcess.bind(settings.health_host, settings.health_port,
                                        settings.health_stale_after)
        except OSError as exc:
            log.error("%s", cannot_listen("health", settings.health_listen, exc))
            return 1
        # First of all: probes are answered (and see "starting") while the rest loads.
        try:
            health.start(asyncio.get_running_loop())
        except OSError as exc:
            log.error("cannot start the health process (--health-listen): %s", exc)
            health.listener.close()
            return 1
    try:
        return await _serve_with(settings, health)
    finally:
        if health is not None:
            health.detach()
            await asyncio.to_thread(health.close)


async def _serve_with(settings: Settings, health: HealthProcess | None) -> int:
    try:
        app = build_app(settings)
    except RulesError as exc:
        log.error("%s", exc)
        return 2
    state = app[STATE_KEY]
    if health is not None:
        health.readiness = lambda: readiness(state)
    protocol_errors.install(state.metrics.rejected.labels(reason="malformed_http").inc)
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           handler_cancellation=True, shutdown_timeout=settings.shutdown_grace,
                           keepalive_timeout=settings.idle_timeout,
                           # after an early answer (413, 408), unread body bytes are drained
                           # for 2 s, not aiohttp's 10, before the connection closes
                           lingering_time=2.0)
    admin = web.AppRunner(build_admin_app(state), handle_signals=False, access_log=None,
                          handler_cancellation=True, shutdown_timeout=1.0,
                          keepalive_timeout=settings.idle_timeout)
    state.starting = True
    await runner.setup()
    await admin.setup()
    proxy_site = CappedSite(
        runner, settings.listen_host, settings.listen_port,
        cap=settings.max_connections or default_cap(),
        refused=state.metrics.rejected.labels(reason="too_many_connections").inc)
    state.connections = proxy_site
    for kind, where, site in (("proxy", settings.listen, proxy_site),
                              ("admin", settings.admin_listen, web.TCPSite(
                                  admin, settings.admin_host, settings.admin_port,
                                  reuse_address=True))):
        try:
            await site.start()
        except OSError as exc:
            log.error("%s", cannot_listen(kind, where, exc))
            await admin.cleanup()
            await runner.cleanup()
            return 1
    state.starting = False
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    gc.freeze()
    log.info("listening on http://%s, upstream %s; admin on http://%s%s", settings.listen,
             settings.upstream, _bound(admin, settings.admin_listen),
             f"; probes also on http://{health.address}" if health is not None else "",
             extra={"listen": settings.listen, "upstream": settings.upstream,
                    "admin": _bound(admin, settings.admin_listen),
                    "health": health.address if health is not None else None})
    frozen = asyncio.create_task(_freeze_when_indexed(state))
    trimming = asyncio.create_task(trim_after_work(), name="malloc-trim")
    unfreezing = asyncio.create_task(unfreeze_now_and_then(), name="gc-unfreeze")
    await stop.wait()
    for task in (frozen, trimming, unfreezing):
        task.cancel()
    state.draining = True
    state.body_reads.drain(settings.shutdown_grace)
    log.info("draining: in-flight requests have %.0f s to finish", settings.shutdown_grace)
    await runner.cleanup()
    await admin.cleanup()
    log.info("stopped")
    return 0


async def _freeze_when_indexed(state: ProxyState) -> None:
    """The catalog the first scan built lives as long as the process: out of full
    collections too, as what start-up made."""
    if state.transcripts is not None:
        with contextlib.suppress(Exception):  # a failed scan is logged where it failed
            await state.transcripts.wait_indexed()
        gc.freeze()


def _bound(runner: web.AppRunner, configured: str) -> str:
    """Where a runner really listens (port 0 in the settings picks a free one)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return f"{address[0]}:{address[1]}"
    return configured

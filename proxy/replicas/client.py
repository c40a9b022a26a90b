"""The connection to the shared store (Redis, through redis-py's asyncio client), guarded.

Every call goes through ``run``: a store known to be down is not asked (see ``health.py``),
a call that fails or takes longer than ``timeout`` raises ``StoreUnavailable`` at once and
the caller falls back to what this process holds. Failures are counted one by one and logged
once per episode; the password never reaches a log line (the URL is logged without it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from proxy.replicas.config import StoreURL
from proxy.replicas.health import StoreHealth

__all__ = ["KEY_PREFIX", "SharedClient", "StoreUnavailable"]

T = TypeVar("T")
KEY_PREFIX = "tailfloor:"
_LOG = logging.getLogger("tailfloor.store")


class StoreUnavailable(Exception):
    """The shared store did not answer (down, slow, full): use the local store."""


class SharedClient:
    def __init__(self, url: StoreURL, *, timeout: float = 0.25, max_connections: int = 32,
                 on_error: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.timeout = timeout
        self.health = StoreHealth(clock)
        self._on_error = on_error
        # A bounded pool that waits briefly for a free connection instead of failing at once.
        tls: dict[str, Any] = {}
        connection: type[aioredis.Connection] = aioredis.Connection
        if url.tls:
            connection = aioredis.SSLConnection
            if url.ca_file is not None:
                tls["ssl_ca_certs"] = str(url.ca_file)
        pool = aioredis.BlockingConnectionPool(
            host=url.host, port=url.port, db=url.db, username=url.username,
            password=url.password, socket_timeout=timeout, socket_connect_timeout=timeout,
            max_connections=max_connections, timeout=timeout, health_check_interval=30,
            connection_class=connection, **tls)
        self.redis: aioredis.Redis = aioredis.Redis(connection_pool=pool)

    async def run(self, call: Callable[[aioredis.Redis], Awaitable[T]], what: str,
                  limit: float | None = None) -> T:
        """``call(redis)`` within ``limit`` seconds (four round-trip timeouts by default),
        or StoreUnavailable."""
        if not self.health.usable():
            raise StoreUnavailable("the shared store is in its backoff")
        try:
            result = await asyncio.wait_for(call(self.redis), limit or self.timeout * 4)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(what, exc)
            raise StoreUnavailable(what) from exc
        if self.health.succeeded():
            _LOG.info("the shared store %s answers again", self.url)
        return result

    def _failed(self, what: str, exc: BaseException) -> None:
        self._on_error()
        if self.health.failed():
            # The exception's text names the operation and the address, never the password.
            _LOG.warning("the shared store %s failed (%s: %s: %s); falling back to this "
                         "process's own memory, retrying with a backoff; further failures "
                         "are only counted", self.url, what, type(exc).__name__,
                         str(exc)[:200])

    async def ping(self) -> bool:
        try:
            await self.run(lambda r: r.ping(), "ping")
        except StoreUnavailable:
            return False
        return True

    async def close(self) -> None:
        await self.redis.aclose()
